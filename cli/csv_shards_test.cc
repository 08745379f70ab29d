#include "cli/csv_shards.h"

#include <cstdlib>
#include <filesystem>
#include <string>

#include "core/file_util.h"
#include "core/npy.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace {

std::string Path(const std::string& name) {
  return JoinPath(::testing::TempDir(), name);
}

TEST(ParseFloatCellTest, RoundsThroughFloat64AsNumpyDoes) {
  // Just above the midpoint between 1 and the next float32: correctly
  // rounded to float64 it is the midpoint itself, which rounds to even (1);
  // strtof rounds the decimal straight up.
  const char* text = "1.000000059604644775390625000000001";
  auto f = ParseFloatCell(text);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(*f, 1.0f);
  EXPECT_NE(*f, std::strtof(text, nullptr));
  EXPECT_EQ(*ParseFloatCell(" -2.5 "), -2.5f);
  EXPECT_EQ(*ParseFloatCell("+1e-3"), static_cast<float>(1e-3));
}

TEST(ParseFloatCellTest, RefusesWhatIsNotAFiniteFloat32) {
  EXPECT_EQ(ParseFloatCell("n/a").status().message(), "is not a number");
  EXPECT_EQ(ParseFloatCell("  ").status().message(), "is empty");
  EXPECT_EQ(ParseFloatCell("1.5x").status().message(), "is not a number");
  EXPECT_EQ(ParseFloatCell("nan").status().message(), "is not a finite number");
  EXPECT_EQ(ParseFloatCell("1e39").status().message(),
            "is out of float32 range");
}

TEST(ParseClassCellTest, TakesIntegralValuesOnly) {
  EXPECT_EQ(*ParseClassCell("7"), 7);
  EXPECT_EQ(*ParseClassCell("3.0"), 3);
  EXPECT_EQ(ParseClassCell("3.5").status().message(),
            "is not an integral class id");
  EXPECT_EQ(ParseClassCell("-1").status().message(), "is a negative class id");
  EXPECT_EQ(ParseClassCell("cat").status().message(), "is not a number");
}

CsvConvertOptions Options(const std::string& csv, const std::string& out) {
  CsvConvertOptions options;
  options.inputs = {csv};
  options.out_dir = out;
  options.shard_rows = 2;
  options.target_columns = {"label"};
  return options;
}

TEST(ConvertCsvTest, TargetInTheMiddleAndDefaultFeatures) {
  const std::string csv = Path("middle.csv");
  ASSERT_TRUE(
      WriteFileAtomically(csv, "a,label,b\r\n1,0,2\r\n\r\n3,1,4\r\n5,2,6\r\n")
          .ok());
  auto pairs = ConvertCsv(Options(csv, Path("middle_out")));
  ASSERT_TRUE(pairs.ok()) << pairs.status();
  ASSERT_EQ(pairs->size(), 2u);
  auto x = ReadNpy(JoinPath(Path("middle_out"), "x-00001.npy"));
  auto y = ReadNpy(JoinPath(Path("middle_out"), "y-00001.npy"));
  ASSERT_TRUE(x.ok() && y.ok());
  EXPECT_EQ(x->shape(), (Shape{1, 2}));
  EXPECT_EQ(x->data<float>()[1], 6.0f);
  EXPECT_EQ(y->data<int64_t>()[0], 2);
}

TEST(ConvertCsvTest, BadCellNamesFileLineAndColumnAndLeavesNothing) {
  const std::string csv = Path("bad.csv");
  ASSERT_TRUE(
      WriteFileAtomically(csv, "age,label\n1,0\n2,1\n3,0\nn/a,1\n").ok());
  const std::string out = Path("bad_out");
  auto pairs = ConvertCsv(Options(csv, out));
  EXPECT_EQ(pairs.status().message(),
            csv + ":5: column \"age\": \"n/a\" is not a number");
  EXPECT_FALSE(std::filesystem::exists(out));
}

TEST(ConvertCsvTest, RaggedLineAndMissingColumn) {
  const std::string csv = Path("ragged.csv");
  ASSERT_TRUE(WriteFileAtomically(csv, "a,label\n1,0\n2\n").ok());
  EXPECT_EQ(ConvertCsv(Options(csv, Path("ragged_out"))).status().message(),
            csv + ":3: 1 cells, the header has 2 columns");
  CsvConvertOptions options = Options(csv, Path("ragged_out"));
  options.target_columns = {"y"};
  EXPECT_EQ(ConvertCsv(options).status().message(),
            csv + ":1: no column \"y\" (named by --target_columns)");
}

TEST(ConvertCsvTest, ClassTargetMustBeIntegral) {
  const std::string csv = Path("fraction.csv");
  ASSERT_TRUE(WriteFileAtomically(csv, "a,label\n1,0.5\n").ok());
  EXPECT_EQ(ConvertCsv(Options(csv, Path("fraction_out"))).status().message(),
            csv + ":2: column \"label\": \"0.5\" is not an integral class id");
}

}  // namespace
}  // namespace trainyard
