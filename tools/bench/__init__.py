"""Benchmarks and measurements: `python -m tools.bench.NAME --help`. Kernel bandwidth and scaling (kernel_bench,
qmatmul_bench, prompt_rows_bench, dequant_bench, attention_bench), whole decode steps and end-to-end runs (step_profile,
cpu_time_peer, bench_big, big_results (make bench-big's table), server_bench, pages_bench, moe_bench (make bench-moe), lora_bench, sampling_bench, dashboard_bench), memory and quality
(memory_table, reload_memory, busy_load, weight_quality, kv_quant_error), the app's behaviour under load (gil_wait_check, loop_check) and
the Triton kernels' ahead-of-time compile check (compile_check). gpu_check.sh runs the GPU tests and benches on a
lent GPU machine; int8_peak.cpp is a C++ micro-benchmark of one core's int8 dot-product peak.

_qgemm_bench, _q6_bench and _q8g_bench are helpers of qmatmul_bench (its --prompt-rows, --q6 and --q8-groups),
not commands.
"""
