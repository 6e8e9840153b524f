#include "io/json_writer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "io/json.h"

namespace tide::io::json {
namespace {

TEST(JsonWriter, WritesStringsAndNumbersThatReadBack) {
  EXPECT_EQ(quote("a\"b\\c\n\x01"), "\"a\\\"b\\\\c\\n\\u0001\"");
  EXPECT_EQ(quote("tab\there\r\x1f"), "\"tab\\there\\r\\u001f\"");
  EXPECT_EQ(quote("\xc3\xa9"), "\"\xc3\xa9\"");  // UTF-8 passes through
  EXPECT_EQ(number(100000000), "100000000");
  EXPECT_EQ(number(-3), "-3");
  EXPECT_EQ(number(std::nan("")), "null");
  EXPECT_EQ(number(std::numeric_limits<double>::infinity()), "null");
  for (double x : {2.2e9, 0.1, 1.0 / 3.0, 1e300, 5e-324, 2.123456789012345e9, 1.5}) {
    EXPECT_EQ(parse(number(x)).number(), x) << number(x);
  }
  // Every byte below 0x20 comes back as itself.
  std::string all;
  for (int c = 1; c < 0x20; ++c) all += static_cast<char>(c);
  all += "\"\\/";
  EXPECT_EQ(parse(quote(all)).string(), all);
}

TEST(JsonWriter, ObjectsAndArraysMemberByMember) {
  Array sizes;
  sizes.add_uint(1).add_uint(18446744073709551615u);
  Object inner;
  inner.add_bool("on", true).add_bool("off", false);
  Object o;
  o.add_uint("count", 3)
      .add_string("name \"x\"", "line\nbreak")
      .add_raw("seconds", "0.125")
      .add("inner", inner)
      .add("sizes", sizes)
      .add("empty", Object{})
      .add("none", Array{});
  EXPECT_EQ(o.text(),
            "{\"count\": 3, \"name \\\"x\\\"\": \"line\\nbreak\", \"seconds\": 0.125, "
            "\"inner\": {\"on\": true, \"off\": false}, \"sizes\": [1, 18446744073709551615], "
            "\"empty\": {}, \"none\": []}");
  const Value v = parse(o.text());
  EXPECT_EQ(v.find("name \"x\"")->string(), "line\nbreak");
  EXPECT_EQ(v.find("inner")->find("off")->boolean(), false);
  EXPECT_EQ(v.find("sizes")->items().size(), 2u);

  Array lines(",\n  ");
  lines.add_string("a").add(Object{}).add_raw("null");
  EXPECT_EQ(lines.text(), "[\"a\",\n  {},\n  null]");
}

}  // namespace
}  // namespace tide::io::json
