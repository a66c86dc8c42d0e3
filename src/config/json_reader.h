// Reads one JSON object of a ds_config against what this project knows, so
// that no key is ever silently ignored: each key is either read, accepted only
// at its DeepSpeed default (a feature not implemented here), or reported as
// unknown by finish(), with the nearest known key as a suggestion.
//
// Every error is reported in one run: a reader made with an error list (the
// top level of a ds_config; child() readers share it) records a bad value
// -- reading the key's default instead, so parsing goes on -- and every
// unknown key, and throw_recorded() throws one ConfigError naming them all.
// fail() (a combination of keys that cannot work) throws at once, with the
// errors recorded before it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "zero/config.h"

namespace zero::config_detail {

using nlohmann::json;

class ObjectReader {
 public:
  using ErrorList = std::shared_ptr<std::vector<std::string>>;

  // `obj` may be null (block absent): every read then yields its default.
  // Without `errors` the first error throws.
  ObjectReader(const json* obj, std::string path, ErrorList errors = nullptr);

  // Throws one ConfigError naming every error recorded so far (if any).
  void throw_recorded() const;

  // DeepSpeed's pydantic blocks (zero_optimization, offload_*, fp16, bf16)
  // drop "auto" values before validation, so the default applies; the
  // top-level scalars and the optimizer/scheduler params do not.
  ObjectReader& auto_means_default() {
    auto_default_ = true;
    return *this;
  }

  // The dotted path of a key inside this object, e.g. "zero_optimization.stage".
  std::string path_of(const std::string& key) const;

  // Finds `key` or one of its aliases (DeepSpeed accepts both spellings).
  // Two spellings of the same key at once is an error. Marks it consumed.
  const json* find(const std::string& key, const std::vector<std::string>& aliases = {});

  // True when the value is the string "auto" (as the HF integration writes).
  static bool is_auto(const json* v) { return v && v->is_string() && v->get<std::string>() == "auto"; }

  bool get_bool(const std::string& key, bool def, const std::vector<std::string>& aliases = {});
  // Null gives `def`.
  std::string get_string(const std::string& key, const std::string& def);
  // Integers: JSON numbers like 5e8 are doubles; accepted when integral.
  int64_t get_int(const std::string& key, int64_t def, int64_t min, int64_t max,
                  const std::vector<std::string>& aliases = {});
  // A non-negative element count; "auto" resolves to DeepSpeed's default.
  int64_t get_size(const std::string& key, int64_t def, const std::vector<std::string>& aliases = {});
  // Unset or "auto" gives nullopt.
  std::optional<int64_t> get_opt_int(const std::string& key, int64_t min, int64_t max);
  double get_double(const std::string& key, double def, double min, double max);
  // Case-sensitive choice unless `ignore_case`; returns the canonical spelling.
  std::string get_choice(const std::string& key, const std::string& def,
                         const std::vector<std::string>& allowed, bool ignore_case = false);
  std::optional<std::string> get_opt_choice(const std::string& key,
                                            const std::vector<std::string>& allowed,
                                            bool ignore_case = false);

  // A nested object (absent or null gives an empty reader).
  ObjectReader child(const std::string& key, const std::vector<std::string>& aliases = {});

  // A DeepSpeed key this project does not implement: allowed only when it
  // equals `default_value` (so the behaviour is exactly what was asked for).
  void unsupported_unless(const std::string& key, const json& default_value,
                          const std::vector<std::string>& aliases = {});
  // A DeepSpeed key whose value cannot change what this project does.
  void accept_any(const std::string& key, const std::vector<std::string>& aliases = {});

  // Marks every key of this object consumed (a disabled feature's settings).
  void accept_all_remaining();

  // An error for each key not consumed above, naming it and the nearest known key.
  void finish();

  // Throws, naming `key` and `what` after the errors recorded so far.
  [[noreturn]] void fail(const std::string& key, const std::string& what) const;
  // A value of the wrong type or range: recorded (or thrown without a
  // list); the caller reads the default.
  void bad_value(const std::string& key, const json& value, const std::string& expected);

 private:
  // nullopt (the error recorded) when `v` is not an integer in [min, max].
  std::optional<int64_t> parse_int(const std::string& key, const json& v, int64_t min, int64_t max);
  // Records the error (or throws without a list).
  void record(const std::string& message);
  std::string with_recorded(const std::string& message) const;

  // find() for typed reads: "auto" reads as absent when auto_default_.
  const json* find_value(const std::string& key, const std::vector<std::string>& aliases);

  const json* obj_;
  std::string path_;
  bool auto_default_ = false;
  std::set<std::string> consumed_;
  std::vector<std::string> known_;  // every key name asked about, for suggestions
  ErrorList errors_;                // shared with the children; null: throw at once
};

}  // namespace zero::config_detail
