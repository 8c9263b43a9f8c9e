// Replays inputs through one fuzz harness without libFuzzer: the `main` of the troupe_replay_<name>
// executables that the normal (g++) build makes from fuzz/<name>_fuzz.cpp (Note [replay]).
// Usage: troupe_replay_<name> FILE_OR_DIR...; a folder's files are replayed in name order.

// Note [replay]
// The normal build's ctest sends inputs through the harness's LLVMFuzzerTestOneInput: every
// input that once made a harness fail (fuzz/regressions/<name>/) and every committed seed. So a
// fixed finding stays fixed without clang. Here a finding is one of: a crash; an exception other
// than troupe::error (std::terminate); a violated property (abort); one allocation of more than
// 2 GiB (libFuzzer's default malloc limit). On a finding the input's path is printed and the
// process aborts.
// Sanitizer findings (a read past a buffer that does not crash) show only in the fuzz build.
// The run fails when it replayed no input at all.

#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <new>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);
extern "C" __attribute__((weak)) int LLVMFuzzerInitialize(int* argc, char*** argv);

namespace {

constexpr std::size_t malloc_limit = std::size_t{2} << 30;

// The input being replayed, for the report of a crash (read in a signal handler).
char current[4096] = "(none)";

void say(const char* text) { (void)!::write(STDERR_FILENO, text, std::strlen(text)); }

void report(const char* what) {
  std::signal(SIGABRT, SIG_DFL);  // reported once: the abort that follows is not reported again
  say("replay: ");
  say(what);
  say(" on input ");
  say(current);
  say("\n");
}

extern "C" void on_signal(int sig) {
  report(sig == SIGABRT ? "abort" : "fatal signal");
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

std::vector<std::filesystem::path> inputs_of(const char* arg) {
  const std::filesystem::path p(arg);
  if (!std::filesystem::is_directory(p)) return {p};
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::recursive_directory_iterator(p))
    if (e.is_regular_file()) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  return files;
}

std::vector<std::uint8_t> read_all(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "replay: cannot open %s\n", p.c_str());
    std::exit(2);
  }
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

// One allocation beyond the limit is a finding, as with libFuzzer's -malloc_limit_mb.
void* operator new(std::size_t n) {
  if (n > malloc_limit) {
    report("allocation of more than 2 GiB");
    std::abort();
  }
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

int main(int argc, char** argv) {
  for (int sig : {SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL}) std::signal(sig, on_signal);
  std::set_terminate([] {
    report("an exception other than troupe::error");
    std::abort();
  });
  if (LLVMFuzzerInitialize != nullptr) LLVMFuzzerInitialize(&argc, &argv);
  std::size_t replayed = 0;
  for (int i = 1; i < argc; ++i) {
    for (const auto& path : inputs_of(argv[i])) {
      const auto bytes = read_all(path);
      std::snprintf(current, sizeof current, "%s", path.c_str());
      static const std::uint8_t none = 0;  // libFuzzer never passes a null pointer
      LLVMFuzzerTestOneInput(bytes.empty() ? &none : bytes.data(), bytes.size());
      ++replayed;
    }
  }
  if (replayed == 0) {
    std::fprintf(stderr, "replay: no input found in the arguments\n");
    return 1;
  }
  std::printf("replay: %zu inputs, no finding\n", replayed);
  return 0;
}
