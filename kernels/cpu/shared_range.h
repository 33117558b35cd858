// share_range: at::parallel_for's shape (fn(b0, b1) over pieces of [begin, end), each at least `grain` long)
// for the loader's byte moving, which often runs while the cores are busy elsewhere (the tokenizer's thread
// beside it, a model serving beside a loading one). The calling thread works through the pieces itself and
// helper threads take pieces when they get a core; the call returns once every piece is done, waiting only for
// pieces a helper has started, never for a helper to be scheduled. OpenMP's fork and join waits at its barrier
// for every thread of the team: with two busy-loop processes on the two cores, loading a Q8_0 file through
// ~800 such calls took 6-7 s against 1.4 s on the calling thread alone (tools.bench.busy_load).
//
// The helpers (at::get_num_threads() - 1 of them, started on first use and kept) wait for the next call awake
// for a moment, then asleep on a condition variable. A piece's bits never depend on which thread runs it. An
// exception thrown by fn is re-raised on the calling thread once every started piece has finished.
#pragma once

#include <ATen/Parallel.h>

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

namespace pagedeck {
namespace shared_range {

struct Call {
  std::function<void(int64_t)> piece;  // runs piece i
  int64_t pieces = 0;
  std::atomic<int64_t> next{0}, done{0};
  std::mutex m;
  std::condition_variable finished;
  std::exception_ptr error;

  // Take pieces until none is left; each one counted done, thrown or not.
  void work() {
    for (int64_t i; (i = next.fetch_add(1)) < pieces;) {
      try {
        piece(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(m);
        if (!error) error = std::current_exception();
      }
      if (done.fetch_add(1) + 1 == pieces) {
        std::lock_guard<std::mutex> lock(m);  // the caller checks `done` under this lock before it sleeps
        finished.notify_all();
      }
    }
  }
};

class Helpers {
 public:
  // The process's helpers; a forked child starts with none (its parent's threads do not exist there).
  static Helpers& get() {
    static std::once_flag once;
    std::call_once(once, [] { pthread_atfork(nullptr, nullptr, [] { current() = new Helpers(); }); });
    return *current();
  }

  // Offer the call to the helpers, `want` of them at most (more are started as needed).
  void offer(const std::shared_ptr<Call>& call, int64_t want) {
    std::lock_guard<std::mutex> lock(m_);
    while (started_ < want) {
      std::thread([this] { loop(); }).detach();  // kept for the process's life, like OpenMP's team
      ++started_;
    }
    calls_.push_back(call);
    offered_.fetch_add(1);
    wake_.notify_all();
  }

  // Withdraw the call (every piece taken): helpers stop picking it up.
  void withdraw(const std::shared_ptr<Call>& call) {
    std::lock_guard<std::mutex> lock(m_);
    calls_.erase(std::remove(calls_.begin(), calls_.end(), call), calls_.end());
  }

 private:
  static Helpers*& current() {
    static Helpers* helpers = new Helpers();  // never destroyed: its detached threads outlive static teardown
    return helpers;
  }

  void loop() {
    for (;;) {
      std::shared_ptr<Call> call;
      {
        std::unique_lock<std::mutex> lock(m_);
        // a call whose pieces are all taken stays offered until its caller withdraws it: wait for one with some.
        // The call found open is the one taken: `next` moves without the lock (the caller and the other helpers
        // take pieces meanwhile), so a second search could find none and read past the deque's end.
        const auto open = [](const std::shared_ptr<Call>& c) { return c->next.load() < c->pieces; };
        auto found = calls_.end();
        wake_.wait(lock, [&] { return (found = std::find_if(calls_.begin(), calls_.end(), open)) != calls_.end(); });
        call = *found;
      }
      call->work();
      call.reset();
      // The loader offers its calls back to back, a few Python statements apart: a helper that slept between
      // them arrived after the caller had done most of each (~1 MB) call. Wait for the next one awake for a
      // moment first, as OpenMP's threads do; asleep after that, so a busy machine loses at most this much.
      const uint64_t seen = offered_.load();
      const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(kSpinMicros);
      for (int i = 0; offered_.load() == seen; ++i) {
        if ((i & 63) == 0 && std::chrono::steady_clock::now() > until) break;
        std::this_thread::yield();
      }
    }
  }

  static constexpr int64_t kSpinMicros = 200;
  std::mutex m_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Call>> calls_;
  int64_t started_ = 0;
  std::atomic<uint64_t> offered_{0};  // calls offered so far
};

// Set on a thread whose share_range calls run on it alone (a model's weights moving in the background at the
// lowest priority: helpers at normal priority would take cores from the decode running beside it).
inline bool& solo() {
  thread_local bool alone = false;
  return alone;
}

template <typename F>
void share_range(int64_t begin, int64_t end, int64_t grain, const F& fn) {
  const int64_t n = end - begin, threads = at::get_num_threads();
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  if (threads <= 1 || n <= grain || solo() || at::in_parallel_region()) {
    fn(begin, end);
    return;
  }
  // pieces small enough that a helper arriving late still finds some, never below the grain
  const int64_t len = std::max(grain, (n + 4 * threads - 1) / (4 * threads));
  auto call = std::make_shared<Call>();
  call->pieces = (n + len - 1) / len;
  call->piece = [&](int64_t i) { fn(begin + i * len, std::min(end, begin + (i + 1) * len)); };
  Helpers& helpers = Helpers::get();
  helpers.offer(call, std::min(threads - 1, call->pieces - 1));
  call->work();
  helpers.withdraw(call);
  {
    std::unique_lock<std::mutex> lock(call->m);
    call->finished.wait(lock, [&] { return call->done.load() == call->pieces; });
  }
  if (call->error) std::rethrow_exception(call->error);
}

}  // namespace shared_range
}  // namespace pagedeck
