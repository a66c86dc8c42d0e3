// What every rank of a group must agree on before a collective moves data:
// the op, its element count and dtype, and the caller's label ("params of
// unit 'h3'"). Each transport exchanges these records among the ranks of a
// group before (shared memory: alongside) the data, so ranks that disagree
// -- a size that depends on the rank, a unit order that diverged -- get an
// error naming both sides on every rank at once, instead of a hang or a
// silently wrong sum. No torch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace zero::comm {

// Fixed size, trivially copyable: it travels through shared memory and Gloo.
struct SignatureRecord {
  static constexpr size_t kTextBytes = 120;
  uint64_t hash = 0;            // of the whole text (which may be longer than kTextBytes)
  char text[kTextBytes] = {};   // NUL-terminated, truncated
};
static_assert(sizeof(SignatureRecord) == 128, "a record is two cache lines' half");

SignatureRecord make_signature_record(const std::string& text);

// Whether collectives of transports that check nothing themselves (NCCL)
// are compared on the host first: TORCH_DISTRIBUTED_DEBUG=DETAIL, or
// ZERO_CHECK_DEVICE_COLLECTIVES=on (comm/nccl_transport.h says what it costs).
bool device_signature_check_enabled();

// The message when the ranks' records differ -- the first rank whose record
// differs from rank 0's, so every rank reports the same pair -- or "" when
// they all agree. `records` holds one record per group rank; `rank_name(q)`
// names group rank q in the message (e.g. "rank 3 (pid 1234)").
template <typename RankName>
std::string describe_disagreement(const std::string& op, const std::string& group, const SignatureRecord* records,
                                  int size, RankName&& rank_name);

// ---- implementation of the template ------------------------------------------

bool same_signature(const SignatureRecord& a, const SignatureRecord& b);

template <typename RankName>
std::string describe_disagreement(const std::string& op, const std::string& group, const SignatureRecord* records,
                                  int size, RankName&& rank_name) {
  for (int q = 1; q < size; ++q)
    if (!same_signature(records[q], records[0]))
      return op + " on " + group + ": the ranks disagree on the collective: " + rank_name(0) + " runs " +
             records[0].text + ", but " + rank_name(q) + " runs " + records[q].text +
             ". Every rank must issue the same collectives, with the same sizes, in the same order.";
  return {};
}

}  // namespace zero::comm
