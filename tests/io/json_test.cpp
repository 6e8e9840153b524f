#include "io/json.h"

#include <gtest/gtest.h>

#include <cmath>

namespace tide::io::json {
namespace {

TEST(Json, ParsesValues) {
  const Value v = parse(
      R"( {"a": [1, -2.5e3, true, false, null], "b": {"c": "x\"\\\/\n\u00e9\ud83d\ude00"}} )");
  ASSERT_EQ(v.kind(), Value::Kind::object);
  const Value* a = v.find("a");
  ASSERT_NE(a, nullptr);
  ASSERT_EQ(a->items().size(), 5u);
  EXPECT_EQ(a->items()[0].number(), 1);
  EXPECT_EQ(a->items()[1].number(), -2500);
  EXPECT_TRUE(a->items()[2].boolean());
  EXPECT_TRUE(a->items()[4].is_null());
  EXPECT_EQ(v.find("b")->find("c")->string(), "x\"\\/\n\xc3\xa9\xf0\x9f\x98\x80");
  EXPECT_EQ(v.find("nope"), nullptr);
}

TEST(Json, RejectsWhatIsNotJsonWithLineAndColumn) {
  const std::pair<const char*, const char*> cases[] = {
      {"", "line 1, column 1: unexpected end of text"},
      {"{\"a\": 01}", "expected ',' or '}'"},
      {"{\"a\": 1,}", "expected a member name"},
      {"[1 2]", "expected ',' or ']'"},
      {"{\"a\": 1}\n x", "line 2, column 2: unexpected text"},
      {"\"tab\there\"", "control character"},
      {"\"\\x\"", "bad escape"},
      {"\"\\ud800\"", "lone surrogate"},
      {"\"open", "unterminated string"},
      {"-", "expected a digit"},
      {"1.", "expected a digit after '.'"},
      {"1e", "expected a digit in the exponent"},
      {"tru", "expected a JSON value"},
      {"{\"a\":1,\"a\":2}", "duplicate member \"a\""},
  };
  for (const auto& [text, what] : cases) {
    try {
      parse(text);
      ADD_FAILURE() << "accepted: " << text;
    } catch (const ParseError& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << text << ": " << e.what();
    }
  }
  EXPECT_THROW(parse(std::string(100, '[') + std::string(100, ']')), ParseError);  // too deep
  EXPECT_NO_THROW(parse(std::string(60, '[') + std::string(60, ']')));
}

}  // namespace
}  // namespace tide::io::json
