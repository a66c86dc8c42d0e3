#include "comm/signature.h"

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

}  // namespace zero::comm
