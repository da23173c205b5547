#pragma once
// Strict reading of the files users write: cluster files, plan files, the data readers' files.
// Its own folder (io/: core + nlohmann-json) because the cluster, synth and data layers all read
// user files with it; none of them owns it.
//
// Every problem becomes one `config_error` line "FILE: field PATH: reason (expected ...)":
//   - syntax errors name the field the parser was in when it stopped, plus line and column;
//   - duplicate keys are errors (plain JSON parsers silently keep the last one);
//   - unknown keys are errors, with a "did you mean" when one allowed key is close;
//   - numbers are checked for type, finiteness and a documented range.

#include <hspmd/core/error.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace hspmd::io {

/// Printable ASCII only, so that a hostile byte in a file cannot garble an error line.
[[nodiscard]] inline std::string printable(std::string_view s, std::size_t max_len = 60) {
  std::string out;
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (out.size() >= max_len) {
      out += "...";
      break;
    }
    if (c >= 0x20 && c < 0x7f) {
      out += ch;
    } else {
      constexpr std::string_view hex = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4U];
      out += hex[c & 0xfU];
    }
  }
  return out;
}

/// A JSON file being read: knows its name and builds the one-line errors.
class json_source {
public:
  explicit json_source(std::string file) : file_(std::move(file)) {}

  [[nodiscard]] const std::string& file() const noexcept { return file_; }

  /// Throws "FILE: field PATH: reason (expected ...)". An empty path means the whole document.
  [[noreturn]] void fail(std::string_view path, const std::string& reason,
                         const std::string& expected) const {
    throw config_error(file_ + ": field " +
                           (path.empty() ? std::string("<root>") : std::string(path)),
                       reason, expected.empty() ? std::string{} : "expected " + expected);
  }

private:
  std::string file_;
};

/// "devices" + 3 -> "devices[3]"; "links" + "intra_node" -> "links.intra_node".
[[nodiscard]] inline std::string json_child(std::string_view path, std::string_view key) {
  return path.empty() ? std::string(key) : std::string(path) + "." + std::string(key);
}
[[nodiscard]] inline std::string json_child(std::string_view path, std::size_t index) {
  return std::string(path) + "[" + std::to_string(index) + "]";
}

/// "a string", "a number", ... for messages.
[[nodiscard]] inline std::string json_kind(const nlohmann::json& j) {
  switch (j.type()) {
  case nlohmann::json::value_t::null:
    return "null";
  case nlohmann::json::value_t::object:
    return "an object";
  case nlohmann::json::value_t::array:
    return "an array";
  case nlohmann::json::value_t::string:
    return "a string (\"" + printable(j.get_ref<const std::string&>(), 30) + "\")";
  case nlohmann::json::value_t::boolean:
    return j.get<bool>() ? "true" : "false";
  case nlohmann::json::value_t::number_integer:
  case nlohmann::json::value_t::number_unsigned:
  case nlohmann::json::value_t::number_float:
    return "the number " + j.dump();
  default:
    return "binary data";
  }
}

/// Reads a whole file; throws `config_error` "FILE: cannot read: ..." when it cannot.
[[nodiscard]] inline std::string read_text_file(const std::filesystem::path& file,
                                                std::size_t max_bytes = std::size_t{64} << 20U) {
  const std::string name = file.string();
  std::error_code ec;
  if (!std::filesystem::exists(file, ec))
    throw config_error(name, "cannot read: no such file", "check the path");
  if (std::filesystem::is_directory(file, ec))
    throw config_error(name, "cannot read: it is a directory", "pass a JSON file");
  std::ifstream in(file, std::ios::binary);
  if (!in)
    throw config_error(name, "cannot read: permission denied or I/O error",
                       "check the file's permissions");
  std::string text;
  std::array<char, 4096> buf{};
  while (in.read(buf.data(), buf.size()) || in.gcount() > 0) {
    text.append(buf.data(), static_cast<std::size_t>(in.gcount()));
    if (text.size() > max_bytes)
      throw config_error(name, "file is larger than " + std::to_string(max_bytes >> 20U) + " MiB",
                         "this cannot be a hand-written configuration file; check the path");
  }
  return text;
}

/// Parses `text`; syntax errors, number overflow and duplicate keys throw `config_error`
/// naming the field being read at the time.
[[nodiscard]] inline nlohmann::json parse_json_strict(std::string_view text, const json_source& src,
                                                      std::string_view what_it_is) {
  const bool blank = std::all_of(text.begin(), text.end(), [](char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
  });
  if (blank)
    src.fail("", "the file is empty", std::string(what_it_is));

  // Tracks the path of the value being parsed, to name it in errors.
  struct frame {
    bool is_array = false;
    std::size_t index = 0;
    std::string key;
    std::set<std::string> keys;
  };
  std::vector<frame> stack;
  const auto path = [&stack] {
    std::string p;
    for (const frame& f : stack) {
      if (f.is_array)
        p = json_child(p, f.index);
      else if (!f.key.empty())
        p = json_child(p, f.key);
    }
    return p;
  };
  const auto element_done = [&stack] {
    if (!stack.empty() && stack.back().is_array)
      ++stack.back().index;
  };
  using event = nlohmann::json::parse_event_t;
  nlohmann::json::parser_callback_t track = [&](int, event e, nlohmann::json& parsed) {
    switch (e) {
    case event::object_start:
      stack.push_back(frame{});
      break;
    case event::array_start:
      stack.push_back(frame{true, 0, {}, {}});
      break;
    case event::key: {
      frame& f = stack.back();
      f.key = parsed.get<std::string>();
      if (!f.keys.insert(f.key).second)
        src.fail(path(), "duplicate key \"" + printable(f.key) + "\"",
                 "each key once per object; delete one of the two");
      break;
    }
    case event::object_end:
    case event::array_end:
      stack.pop_back();
      element_done();
      break;
    case event::value:
      element_done();
      break;
    }
    return true;
  };

  try {
    return nlohmann::json::parse(text, track);
  } catch (const nlohmann::json::exception& e) {
    // nlohmann's text is "[json.exception.parse_error.101] parse error at line 2, column 7: ...";
    // keep what follows the bracketed id.
    std::string msg = e.what();
    if (const auto close = msg.find("] "); close != std::string::npos)
      msg.erase(0, close + 2);
    src.fail(path(), "invalid JSON: " + printable(msg, 200),
             "standard JSON: double-quoted keys and strings, no comments, NaN, Infinity or "
             "trailing commas");
  }
}

/// The object at `path`; fails naming the type found instead.
inline const nlohmann::json& expect_object(const json_source& src, const nlohmann::json& j,
                                           std::string_view path, std::string_view expected) {
  if (!j.is_object())
    src.fail(path, "is " + json_kind(j) + ", not an object", std::string(expected));
  return j;
}

/// The array at `path`; fails naming the type found instead.
inline const nlohmann::json& expect_array(const json_source& src, const nlohmann::json& j,
                                          std::string_view path, std::string_view expected) {
  if (!j.is_array())
    src.fail(path, "is " + json_kind(j) + ", not an array", std::string(expected));
  return j;
}

/// Levenshtein distance, for "did you mean".
[[nodiscard]] inline std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j)
    row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0U : 1U)});
      diag = up;
    }
  }
  return row[b.size()];
}

/// Fails on the first key of `obj` not in `allowed`, suggesting the closest allowed key.
inline void reject_unknown_keys(const json_source& src, const nlohmann::json& obj,
                                std::string_view path,
                                std::initializer_list<std::string_view> allowed) {
  for (const auto& [key, value] : obj.items()) {
    if (std::find(allowed.begin(), allowed.end(), key) != allowed.end())
      continue;
    std::string list;
    std::string_view closest;
    std::size_t best = 3; // suggest only near misses: at most 2 edits
    for (std::string_view a : allowed) {
      list += (list.empty() ? "" : ", ") + std::string(a);
      if (const std::size_t d = edit_distance(key, a); d < best) {
        best = d;
        closest = a;
      }
    }
    std::string expected = "one of " + list;
    if (!closest.empty())
      expected += "; did you mean \"" + std::string(closest) + "\"?";
    src.fail(json_child(path, printable(key)), "unknown key", expected);
  }
}

/// The member `key` of `obj`; fails "missing" when absent.
inline const nlohmann::json& require_key(const json_source& src, const nlohmann::json& obj,
                                         std::string_view path, const char* key,
                                         std::string_view expected) {
  const auto it = obj.find(key);
  if (it == obj.end())
    src.fail(json_child(path, key), "missing", std::string(expected));
  return *it;
}

/// Range and meaning of a number field, for checking and for the "expected ..." text.
struct number_rule {
  double min = 0.0;               ///< smallest allowed value
  bool min_exclusive = true;      ///< true: must be > min; false: >= min
  double max = 0.0;               ///< largest plausible value (larger is "absurdly large")
  bool integer = false;           ///< must be a whole number
  std::string_view meaning;       ///< e.g. "flop/s > 0, e.g. 1.4e13"
  std::string_view max_text = {}; ///< how to print `max` when a plain number reads badly ("1 PiB")
  double least = 0.0; ///< smallest plausible value (0: none; smaller is "absurdly small")
};

[[nodiscard]] inline std::string format_number(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

/// Reads a number under `rule`; fails with the reason (type, not finite, too small, too large).
[[nodiscard]] inline double read_number(const json_source& src, const nlohmann::json& j,
                                        std::string_view path, const number_rule& rule) {
  const std::string expected(rule.meaning);
  if (!j.is_number())
    src.fail(path, "is " + json_kind(j) + ", not a number", expected);
  const double v = j.get<double>();
  if (!std::isfinite(v))
    src.fail(path, "is not finite", expected);
  if (rule.integer && std::floor(v) != v)
    src.fail(path, "must be a whole number, got " + format_number(v), expected);
  if (rule.min_exclusive ? !(v > rule.min) : !(v >= rule.min))
    src.fail(path,
             std::string("must be ") + (rule.min_exclusive ? "> " : ">= ") +
                 format_number(rule.min) + ", got " + format_number(v),
             expected);
  if (rule.least > 0.0 && v < rule.least)
    src.fail(path, "is absurdly small: " + format_number(v) + " < " + format_number(rule.least),
             expected);
  if (v > rule.max)
    src.fail(path,
             "is absurdly large: " + format_number(v) + " > " +
                 (rule.max_text.empty() ? format_number(rule.max) : std::string(rule.max_text)),
             expected);
  return v;
}

/// Reads a non-empty string of at most `max_len` characters from `allowed_chars` (all printable
/// ASCII when empty).
[[nodiscard]] inline std::string read_string(const json_source& src, const nlohmann::json& j,
                                             std::string_view path, std::string_view expected,
                                             std::string_view allowed_chars = {},
                                             std::size_t max_len = 64) {
  if (!j.is_string())
    src.fail(path, "is " + json_kind(j) + ", not a string", std::string(expected));
  const auto& s = j.get_ref<const std::string&>();
  if (s.empty())
    src.fail(path, "is empty", std::string(expected));
  if (s.size() > max_len)
    src.fail(path, "is longer than " + std::to_string(max_len) + " characters",
             std::string(expected));
  for (char c : s) {
    const bool ok = allowed_chars.empty() ? (c >= 0x20 && c < 0x7f)
                                          : allowed_chars.find(c) != std::string_view::npos;
    if (!ok)
      src.fail(path, "has the character '" + printable(std::string_view(&c, 1)) + "'",
               std::string(expected));
  }
  return s;
}

} // namespace hspmd::io
