#include "common/libstdcxx_binding.h"

#include <dlfcn.h>

namespace zero {

std::string std_filesystem_served_elsewhere() {
  // std::filesystem::remove_all(const path&): the call that crashed. With
  // RTLD_DEFAULT the lookup follows the caller's scope, as its PLT does.
  void* sym = dlsym(RTLD_DEFAULT, "_ZNSt10filesystem10remove_allERKNS_7__cxx114pathE");
  Dl_info info{};
  if (!sym || !dladdr(sym, &info) || !info.dli_fname) return "";  // not linked in: nothing to bind
  const std::string lib = info.dli_fname;
  const std::string base = lib.substr(lib.rfind('/') + 1);
  return base.rfind("libstdc++", 0) == 0 ? "" : lib;
}

std::string std_filesystem_binding_warning() {
  const std::string lib = std_filesystem_served_elsewhere();
  if (lib.empty()) return "";
  return "zero-cpp: warning: this program's std::filesystem calls bind to " + lib +
         " instead of libstdc++ (torch's copies there crash: std::filesystem::remove_all jumps to address 0). "
         "Its link lists torch's libraries before libstdc++: link it through zero::zero (find_package(zero)), "
         "which lists libstdc++ first, or run it with LD_PRELOAD naming libstdc++.so.6 (docs/troubleshooting.md)";
}

}  // namespace zero
