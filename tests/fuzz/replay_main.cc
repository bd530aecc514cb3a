// The driver of a fuzz target without libFuzzer (any compiler): runs the
// target's seeds, the inputs in the files and directories given, and a fixed
// number of deterministic mutations of the seeds. What CI runs under g++;
// also how a crash input found by libFuzzer is replayed in a normal build.
//
//   depot_fuzz_<name>_replay [--mutations N] [--seed S] [FILE|DIR]...
//   depot_fuzz_<name>_replay --write_seeds DIR   (the corpus for libFuzzer)
//
// Exits 0 when every input ran; a broken invariant aborts (DEPOT_FUZZ_CHECK).
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_support.h"

namespace {

void Run(const std::string& input) {
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()),
                         input.size());
}

std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A few mutations of the kinds libFuzzer makes, chosen by `rng`.
std::string Mutate(std::string s, std::mt19937_64& rng) {
  const int count = 1 + static_cast<int>(rng() % 4);
  static const uint8_t kInteresting[] = {0x00, 0x01, 0x7f, 0x80, 0xff, 0xfe};
  for (int i = 0; i < count; ++i) {
    const size_t at = s.empty() ? 0 : rng() % s.size();
    switch (rng() % 7) {
      case 0:  // flip a bit
        if (!s.empty()) s[at] = static_cast<char>(s[at] ^ (1 << (rng() % 8)));
        break;
      case 1:  // an interesting byte
        if (!s.empty()) s[at] = static_cast<char>(kInteresting[rng() % 6]);
        break;
      case 2:  // a random byte
        if (!s.empty()) s[at] = static_cast<char>(rng());
        break;
      case 3:  // insert random bytes
        for (size_t n = 1 + rng() % 8; n > 0; --n) {
          s.insert(s.begin() + static_cast<std::ptrdiff_t>(at),
                   static_cast<char>(rng()));
        }
        break;
      case 4:  // delete a range
        if (!s.empty()) s.erase(at, 1 + rng() % 16);
        break;
      case 5:  // duplicate a range
        if (!s.empty()) s.insert(at, s.substr(at, 1 + rng() % 16));
        break;
      case 6:  // truncate
        s.resize(at);
        break;
    }
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t mutations = 10000;
  uint64_t seed = 1;
  std::vector<std::string> paths;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--mutations" && i + 1 < argc) {
      mutations = std::strtoull(argv[++i], nullptr, 10);
    } else if (arg == "--seed" && i + 1 < argc) {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (arg == "--write_seeds" && i + 1 < argc) {
      const std::filesystem::path dir = argv[++i];
      std::filesystem::create_directories(dir);
      int n = 0;
      for (const std::string& s : DepotFuzzSeeds()) {
        std::ofstream(dir / ("seed-" + std::to_string(n++)), std::ios::binary)
            << s;
      }
      std::printf("wrote %d seeds to %s\n", n, dir.c_str());
      return 0;
    } else if (arg.rfind("--", 0) == 0) {
      std::fprintf(stderr, "unknown flag %s\n", arg.c_str());
      return 2;
    } else {
      paths.push_back(arg);
    }
  }
  const auto start = std::chrono::steady_clock::now();
  const std::vector<std::string> seeds = DepotFuzzSeeds();
  uint64_t inputs = 0;
  for (const std::string& s : seeds) {
    Run(s);
    ++inputs;
  }
  for (const std::string& p : paths) {
    if (std::filesystem::is_directory(p)) {
      for (const auto& entry : std::filesystem::directory_iterator(p)) {
        if (!entry.is_regular_file()) continue;
        Run(ReadFile(entry.path()));
        ++inputs;
      }
    } else {
      Run(ReadFile(p));
      ++inputs;
    }
  }
  std::mt19937_64 rng(seed);
  for (uint64_t i = 0; i < mutations && !seeds.empty(); ++i) {
    Run(Mutate(seeds[i % seeds.size()], rng));
    ++inputs;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  std::printf("%llu inputs (%zu seeds, %llu mutations), no failure, %.2f s\n",
              static_cast<unsigned long long>(inputs), seeds.size(),
              static_cast<unsigned long long>(mutations), seconds);
  return 0;
}
