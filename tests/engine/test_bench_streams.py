"""The bench's N-stream run measures N streams decoding together: its cache leaves admission the growth room
it keeps per running sequence, so no stream waits for another to finish (where each stream fits one page,
an exactly-sized cache let only some start, and "decode only" had no step with all N to time)."""
from engine.bench.serving import EngineBench
from engine.bench.synthetic import placeholder_tokenizer, random_model
from engine.bench.workload import Workload
from engine.model.config import ModelConfig


def test_every_stream_decodes_in_the_same_steps():
    config = ModelConfig(arch="llama", vocab_size=512, hidden_size=32, intermediate_size=64, num_layers=2,
                         num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=512)
    model = random_model(config, "cpu")
    streams = [[5 + i + j for j in range(16 - i)] for i in range(8)]
    w = Workload(single=list(range(3, 19)), streams=streams, ttft_first=list(range(3, 40)),
                 ttft_second=list(range(3, 36)) + [7, 8, 9, 10], new_tokens=6, shared_prefix=32)
    bench = EngineBench(model, placeholder_tokenizer(512), w)
    result = bench.run()
    assert result["streams_decode_tok_s"] > 0  # some decode-only step had all 8 streams in it
    assert result["streams_step_ms"] > 0
