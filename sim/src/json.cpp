// Json: a recursive-descent reader for the step profile's JSON.
#include "json.hpp"

#include <cctype>
#include <cstdlib>

#include "loom/error.hpp"

namespace loom::sim {

namespace {

class Reader {
 public:
  explicit Reader(std::string_view text) : _text(text) {}

  Json document() {
    Json value = read();
    skip_space();
    if (_at != _text.size()) fail("trailing characters");
    return value;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw Error(ErrorCode::invalid_argument, "JSON: " + what + " at offset " + std::to_string(_at));
  }
  void skip_space() {
    while (_at < _text.size() && std::isspace(static_cast<unsigned char>(_text[_at]))) ++_at;
  }
  bool consume(std::string_view word) {
    if (_text.substr(_at, word.size()) != word) return false;
    _at += word.size();
    return true;
  }
  void expect(char c) {
    skip_space();
    if (_at >= _text.size() || _text[_at] != c) fail(std::string("expected '") + c + "'");
    ++_at;
  }

  Json read() {
    skip_space();
    if (_at >= _text.size()) fail("unexpected end");
    Json v;
    const char c = _text[_at];
    if (c == '{') {
      v.type = Json::Type::object;
      ++_at;
      skip_space();
      if (consume("}")) return v;
      for (;;) {
        skip_space();
        std::string key = read_string();
        expect(':');
        v.object[key] = read();
        skip_space();
        if (consume("}")) return v;
        expect(',');
      }
    }
    if (c == '[') {
      v.type = Json::Type::array;
      ++_at;
      skip_space();
      if (consume("]")) return v;
      for (;;) {
        v.array.push_back(read());
        skip_space();
        if (consume("]")) return v;
        expect(',');
      }
    }
    if (c == '"') {
      v.type = Json::Type::string;
      v.string = read_string();
      return v;
    }
    if (consume("true")) {
      v.type = Json::Type::boolean;
      v.boolean = true;
      return v;
    }
    if (consume("false")) {
      v.type = Json::Type::boolean;
      return v;
    }
    if (consume("null")) return v;
    const std::string rest(_text.substr(_at, 64));
    char* end = nullptr;
    v.number = std::strtod(rest.c_str(), &end);
    if (end == rest.c_str()) fail("unexpected character");
    _at += static_cast<std::size_t>(end - rest.c_str());
    v.type = Json::Type::number;
    return v;
  }

  std::string read_string() {
    if (_at >= _text.size() || _text[_at] != '"') fail("expected a string");
    ++_at;
    std::string out;
    while (_at < _text.size() && _text[_at] != '"') {
      char c = _text[_at++];
      if (c == '\\') {
        if (_at >= _text.size()) break;
        const char e = _text[_at++];
        switch (e) {
          case 'n':
            c = '\n';
            break;
          case 't':
            c = '\t';
            break;
          case 'u':  // only what json_quoted writes: control characters
            if (_at + 4 > _text.size()) fail("bad \\u escape");
            c = static_cast<char>(
                std::strtol(std::string(_text.substr(_at, 4)).c_str(), nullptr, 16));
            _at += 4;
            break;
          default:
            c = e;
        }
      }
      out += c;
    }
    if (_at >= _text.size()) fail("unterminated string");
    ++_at;
    return out;
  }

  std::string_view _text;
  std::size_t _at = 0;
};

}  // namespace

const Json* Json::find(std::string_view key) const {
  if (type != Type::object) return nullptr;
  auto it = object.find(key);
  return it == object.end() ? nullptr : &it->second;
}

const Json& Json::at(std::string_view key) const {
  const Json* v = find(key);
  if (v == nullptr)
    throw Error(ErrorCode::invalid_argument, "JSON: missing \"" + std::string(key) + "\"");
  return *v;
}

double Json::as_number(std::string_view what) const {
  if (type != Type::number)
    throw Error(ErrorCode::invalid_argument, "JSON: \"" + std::string(what) + "\" is not a number");
  return number;
}

const std::string& Json::as_string(std::string_view what) const {
  if (type != Type::string)
    throw Error(ErrorCode::invalid_argument, "JSON: \"" + std::string(what) + "\" is not a string");
  return string;
}

const std::vector<Json>& Json::as_array(std::string_view what) const {
  if (type != Type::array)
    throw Error(ErrorCode::invalid_argument, "JSON: \"" + std::string(what) + "\" is not an array");
  return array;
}

Json parse_json(std::string_view text) {
  return Reader(text).document();
}

}  // namespace loom::sim
