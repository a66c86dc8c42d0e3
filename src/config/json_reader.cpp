#include "config/json_reader.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <sstream>

namespace zero::config_detail {

namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

}  // namespace

ObjectReader::ObjectReader(const json* obj, std::string path, ErrorList errors)
    : obj_(obj), path_(std::move(path)), errors_(std::move(errors)) {
  if (obj_ && obj_->is_null()) obj_ = nullptr;
  if (obj_ && !obj_->is_object()) {
    const json* bad = obj_;
    obj_ = nullptr;  // read as absent: every key its default
    record("ds_config: " + (path_.empty() ? std::string("the top level") : path_) + " must be a JSON object, got " +
           bad->dump());
  }
}

std::string ObjectReader::path_of(const std::string& key) const {
  return path_.empty() ? key : path_ + "." + key;
}

std::string ObjectReader::with_recorded(const std::string& message) const {
  std::vector<std::string> all = errors_ ? *errors_ : std::vector<std::string>{};
  if (!message.empty()) all.push_back(message);
  if (all.size() == 1) return all.front();
  std::string out = "ds_config has " + std::to_string(all.size()) + " errors:";
  for (const auto& e : all) out += "\n  " + e;
  return out;
}

void ObjectReader::record(const std::string& message) {
  if (!errors_) throw ConfigError(message);
  errors_->push_back(message);
}

void ObjectReader::throw_recorded() const {
  if (errors_ && !errors_->empty()) throw ConfigError(with_recorded(""));
}

void ObjectReader::fail(const std::string& key, const std::string& what) const {
  throw ConfigError(with_recorded("ds_config: " + path_of(key) + " " + what));
}

void ObjectReader::bad_value(const std::string& key, const json& value, const std::string& expected) {
  record("ds_config: " + path_of(key) + " = " + value.dump() + ": expected " + expected);
}

const json* ObjectReader::find(const std::string& key, const std::vector<std::string>& aliases) {
  known_.push_back(key);
  for (auto& a : aliases) known_.push_back(a);
  if (!obj_) return nullptr;
  const json* found = nullptr;
  std::string found_name;
  for (const auto& name : [&] {
         std::vector<std::string> all{key};
         all.insert(all.end(), aliases.begin(), aliases.end());
         return all;
       }()) {
    auto it = obj_->find(name);
    if (it == obj_->end()) continue;
    consumed_.insert(name);
    if (found) {
      record("ds_config: " + path_of(found_name) + " and " + path_of(name) + " are the same setting; give only one");
      continue;  // the first spelling is read
    }
    found = &*it;
    found_name = name;
  }
  if (found && found->is_null()) return nullptr;  // DeepSpeed treats null as "unset"
  return found;
}

const json* ObjectReader::find_value(const std::string& key, const std::vector<std::string>& aliases) {
  const json* v = find(key, aliases);
  return auto_default_ && is_auto(v) ? nullptr : v;
}

bool ObjectReader::get_bool(const std::string& key, bool def, const std::vector<std::string>& aliases) {
  const json* v = find_value(key, aliases);
  if (!v) return def;
  if (!v->is_boolean()) return bad_value(key, *v, "true or false"), def;
  return v->get<bool>();
}

std::string ObjectReader::get_string(const std::string& key, const std::string& def) {
  const json* v = find_value(key, {});
  if (!v || v->is_null()) return def;
  if (!v->is_string()) return bad_value(key, *v, "a string"), def;
  return v->get<std::string>();
}

std::optional<int64_t> ObjectReader::parse_int(const std::string& key, const json& v, int64_t min, int64_t max) {
  int64_t out = 0;
  if (v.is_number_integer()) {
    out = v.get<int64_t>();
  } else if (v.is_number_float() && std::isfinite(v.get<double>()) &&
             std::floor(v.get<double>()) == v.get<double>() && std::fabs(v.get<double>()) < 9.2e18) {
    out = static_cast<int64_t>(v.get<double>());
  } else {
    bad_value(key, v, "an integer" + std::string(is_auto(&v) ? " (\"auto\" is not resolvable here)" : ""));
    return std::nullopt;
  }
  if (out < min || out > max) {
    std::ostringstream os;
    os << "an integer in [" << min << ", ";
    if (max == std::numeric_limits<int64_t>::max()) os << "inf)"; else os << max << "]";
    bad_value(key, v, os.str());
    return std::nullopt;
  }
  return out;
}

int64_t ObjectReader::get_int(const std::string& key, int64_t def, int64_t min, int64_t max,
                              const std::vector<std::string>& aliases) {
  const json* v = find_value(key, aliases);
  return v ? parse_int(key, *v, min, max).value_or(def) : def;
}

int64_t ObjectReader::get_size(const std::string& key, int64_t def,
                               const std::vector<std::string>& aliases) {
  const json* v = find_value(key, aliases);
  if (!v || is_auto(v)) return def;
  return parse_int(key, *v, 0, std::numeric_limits<int64_t>::max()).value_or(def);
}

std::optional<int64_t> ObjectReader::get_opt_int(const std::string& key, int64_t min, int64_t max) {
  const json* v = find_value(key, {});
  if (!v || is_auto(v)) return std::nullopt;
  return parse_int(key, *v, min, max);
}

double ObjectReader::get_double(const std::string& key, double def, double min, double max) {
  const json* v = find_value(key, {});
  if (!v) return def;
  if (!v->is_number())
    return bad_value(key, *v, "a number" + std::string(is_auto(v) ? " (\"auto\" is not resolvable here)" : "")), def;
  double out = v->get<double>();
  if (!std::isfinite(out) || out < min || out > max) {
    std::ostringstream os;
    os << "a number in [" << min << ", " << max << "]";
    return bad_value(key, *v, os.str()), def;
  }
  return out;
}

std::optional<std::string> ObjectReader::get_opt_choice(const std::string& key,
                                                        const std::vector<std::string>& allowed,
                                                        bool ignore_case) {
  const json* v = find_value(key, {});
  if (!v) return std::nullopt;
  if (v->is_string()) {
    std::string s = v->get<std::string>();
    for (const auto& a : allowed)
      if (ignore_case ? lower(a) == lower(s) : a == s) return a;
  }
  bad_value(key, *v, "one of " + join(allowed, ", "));
  return std::nullopt;
}

std::string ObjectReader::get_choice(const std::string& key, const std::string& def,
                                     const std::vector<std::string>& allowed, bool ignore_case) {
  return get_opt_choice(key, allowed, ignore_case).value_or(def);
}

ObjectReader ObjectReader::child(const std::string& key, const std::vector<std::string>& aliases) {
  const json* v = find(key, aliases);
  return ObjectReader(v, path_of(key), errors_);
}

void ObjectReader::unsupported_unless(const std::string& key, const json& default_value,
                                      const std::vector<std::string>& aliases) {
  const json* v = find(key, aliases);
  if (!v || *v == default_value) return;
  // Numbers compare by value whatever their JSON spelling (1 vs 1.0).
  if (v->is_number() && default_value.is_number() && v->get<double>() == default_value.get<double>())
    return;
  record("ds_config: " + path_of(key) + " = " + v->dump() + " is not supported by zero-cpp (only " +
         default_value.dump() + ", DeepSpeed's default)");
}

void ObjectReader::accept_any(const std::string& key, const std::vector<std::string>& aliases) {
  find(key, aliases);
}

void ObjectReader::accept_all_remaining() {
  if (!obj_) return;
  for (auto it = obj_->begin(); it != obj_->end(); ++it) consumed_.insert(it.key());
}

void ObjectReader::finish() {
  if (!obj_) return;
  for (auto it = obj_->begin(); it != obj_->end(); ++it) {
    if (consumed_.count(it.key())) continue;
    std::string best;
    size_t best_d = 4;  // suggest only near misses
    for (const auto& k : known_) {
      size_t d = edit_distance(lower(it.key()), lower(k));
      if (d < best_d) best_d = d, best = k;
    }
    record("ds_config: " + path_of(it.key()) + " is not a key zero-cpp knows" +
           (best.empty() ? std::string() : " (did you mean " + path_of(best) + "?)"));
  }
}

}  // namespace zero::config_detail
