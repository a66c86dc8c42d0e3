#include "comm/signature.h"

#include <cstdlib>
#include <cstring>

namespace zero::comm {

SignatureRecord make_signature_record(const std::string& text) {
  SignatureRecord r;
  uint64_t h = 1469598103934665603ULL;  // FNV-1a: a few dozen bytes per collective
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ULL;
  r.hash = h;
  std::strncpy(r.text, text.c_str(), SignatureRecord::kTextBytes - 1);
  return r;
}

bool same_signature(const SignatureRecord& a, const SignatureRecord& b) {
  return a.hash == b.hash && std::strncmp(a.text, b.text, SignatureRecord::kTextBytes) == 0;
}

bool device_signature_check_enabled() {
  static const bool on = [] {
    const char* debug = std::getenv("TORCH_DISTRIBUTED_DEBUG");
    const char* ours = std::getenv("ZERO_CHECK_DEVICE_COLLECTIVES");
    const std::string d = debug ? debug : "", z = ours ? ours : "";
    return d == "DETAIL" || z == "on" || z == "1" || z == "true";
  }();
  return on;
}

}  // namespace zero::comm
