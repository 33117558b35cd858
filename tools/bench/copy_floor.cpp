// The floor of a load that writes every weight into its own layout: a file's bytes copied from a private map into
// fresh anonymous memory, as the loader's moves do (kernels/cpu/load_moves.cpp), without any regrouping:
//   g++ -O2 -pthread -o /tmp/copy_floor tools/bench/copy_floor.cpp && /tmp/copy_floor FILE.gguf
// Each line maps the file and a fresh destination anew, so it pays what a load pays: the file's pages mapped in
// (page cache to page table) and every destination page faulted in (allocated, zeroed, charged). Printed:
//   copy 1 / 2 threads   the copy with its faults, 1 MB pieces (2 threads: interleaved pieces)
//   again                the same copy into the now-faulted destination (memory bandwidth alone)
//   populate / fault     the destination's pages alone: MADV_POPULATE_WRITE in one call, or one write a page
//   huge pages           the 1-thread copy after MADV_HUGEPAGE on the destination (a VM may back fresh 2 MB
//                        pages slowly the first time)
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

namespace {

constexpr size_t kPiece = 1 << 20;
constexpr int kPopulateWrite = 23;  // MADV_POPULATE_WRITE (Linux 5.14+)

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

struct Copy {
  const char* src;
  char* dst;
  size_t n;
  int threads, index;
};

void* copy_pieces(void* arg) {
  const Copy& c = *static_cast<Copy*>(arg);
  for (size_t at = c.index * kPiece; at < c.n; at += c.threads * kPiece)
    std::memcpy(c.dst + at, c.src + at, at + kPiece < c.n ? kPiece : c.n - at);
  return nullptr;
}

double copy(const char* src, char* dst, size_t n, int threads) {
  pthread_t th[8];
  Copy args[8];
  const double t0 = now();
  for (int i = 0; i < threads; ++i) {
    args[i] = {src, dst, n, threads, i};
    pthread_create(&th[i], nullptr, copy_pieces, &args[i]);
  }
  for (int i = 0; i < threads; ++i) pthread_join(th[i], nullptr);
  return now() - t0;
}

char* fresh(size_t n) {
  return static_cast<char*>(mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: copy_floor FILE\n");
    return 2;
  }
  const int fd = open(argv[1], O_RDONLY);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) {
    std::perror(argv[1]);
    return 1;
  }
  const size_t n = st.st_size;
  auto src = [&] { return static_cast<const char*>(mmap(nullptr, n, PROT_READ, MAP_PRIVATE, fd, 0)); };
  std::printf("%s: %.2f GB\n", argv[1], n / 1e9);
  for (int threads : {1, 2}) {
    const char* s = src();
    char* d = fresh(n);
    const double faulting = copy(s, d, n, threads);
    const double again = copy(s, d, n, threads);
    std::printf("copy, %d thread%s: %.3f s (again, faulted: %.3f s)\n", threads, threads > 1 ? "s" : "", faulting, again);
    munmap(d, n);
    munmap(const_cast<char*>(s), n);
  }
  char* d = fresh(n);
  double t0 = now();
  if (madvise(d, n, kPopulateWrite) == 0) {
    std::printf("destination alone, populate: %.3f s\n", now() - t0);
  } else {
    std::printf("destination alone, populate: refused (a kernel before 5.14)\n");
  }
  munmap(d, n);
  d = fresh(n);
  t0 = now();
  for (size_t at = 0; at < n; at += 4096) d[at] = 1;
  std::printf("destination alone, a write a page: %.3f s\n", now() - t0);
  munmap(d, n);
  const char* s = src();
  d = fresh(n);
  madvise(d, n, MADV_HUGEPAGE);
  std::printf("copy into huge pages, 1 thread: %.3f s\n", copy(s, d, n, 1));
  return 0;
}
