// A program that calls libstdc++'s std::filesystem and links torch. Built
// twice: linked as zero::zero links users' programs (libstdc++ searched
// first) and linked plainly against torch (the wheel's libtorch.so, which
// exports copies of those functions, searched first; issue 36 item 1 found
// that state in the GPU image's GCC 13 build, where such a call jumped to
// address 0). The std_bindings checks (tests/CMakeLists.txt) require the
// first to bind every std:: call to libstdc++ and the second not to, and
// this program's own guard (common/libstdcxx_binding.h) to tell them apart:
// exit 0 after the calls, or exit 3 with the warning before making them.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <system_error>

#include <ATen/ATen.h>

#include "common/libstdcxx_binding.h"

int main() {
  if (const std::string warning = zero::std_filesystem_binding_warning(); !warning.empty()) {
    std::fprintf(stderr, "%s\n", warning.c_str());
    return 3;
  }
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "zero_std_binding_probe";
  std::error_code ec;
  std::filesystem::create_directories(dir / "a", ec);
  const auto removed = std::filesystem::remove_all(dir, ec);
  std::printf("removed %ju entries; %s\n", static_cast<uintmax_t>(removed), at::ones({2}).sum().toString().c_str());
  return 0;
}
