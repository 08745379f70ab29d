#include "kernels/cuda/gemm_algo_cache.h"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace trainyard {
namespace gpu {
namespace {

// A cache file under the test's temporary folder, named by
// TRAINYARD_GEMM_CACHE.
std::string UseCacheFile(const std::string& name) {
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
  setenv("TRAINYARD_GEMM_CACHE", path.c_str(), 1);
  return path;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(GemmAlgoCacheTest, StoresAppendToTheFileAndALaterCacheReadsThem) {
  const std::string path = UseCacheFile("sub/dir/algos.tsv");
  {
    GemmAlgoCache cache(4);
    int index = -1;
    EXPECT_FALSE(cache.Lookup("gpu|a", &index));
    cache.Store("gpu|a", 2);
    cache.Store("gpu|b", 0);
    cache.Store("gpu|a", 3);  // known: keeps 2, writes nothing
    ASSERT_TRUE(cache.Lookup("gpu|a", &index));
    EXPECT_EQ(index, 2);
  }
  EXPECT_EQ(ReadAll(path), "gpu|a\t2\ngpu|b\t0\n");
  GemmAlgoCache later(4);
  int index = -1;
  ASSERT_TRUE(later.Lookup("gpu|b", &index));
  EXPECT_EQ(index, 0);
  ASSERT_TRUE(later.Lookup("gpu|a", &index));
  EXPECT_EQ(index, 2);
}

TEST(GemmAlgoCacheTest, DamagedLinesAndIndicesOutOfRangeAreSkipped) {
  const std::string path = UseCacheFile("damaged.tsv");
  {
    std::ofstream out(path);
    out << "no tab\n"
        << "k|bad\tx\n"
        << "k|neg\t-1\n"
        << "k|big\t4\n"
        << "k|ok\t3\n"
        << "k\twith\ttabs\t1\n";
  }
  GemmAlgoCache cache(4);
  int index = -1;
  EXPECT_FALSE(cache.Lookup("no tab", &index));
  EXPECT_FALSE(cache.Lookup("k|bad", &index));
  EXPECT_FALSE(cache.Lookup("k|neg", &index));
  EXPECT_FALSE(cache.Lookup("k|big", &index));
  ASSERT_TRUE(cache.Lookup("k|ok", &index));
  EXPECT_EQ(index, 3);
  // The index is after the last tab; the key is all before it.
  ASSERT_TRUE(cache.Lookup("k\twith\ttabs", &index));
  EXPECT_EQ(index, 1);
}

TEST(GemmAlgoCacheTest, WithoutAFileTheChoicesStayInTheProcess) {
  unsetenv("TRAINYARD_GEMM_CACHE");
  setenv("HOME", "", 1);
  GemmAlgoCache cache(4);
  int index = -1;
  EXPECT_FALSE(cache.Lookup("k", &index));
  cache.Store("k", 1);
  ASSERT_TRUE(cache.Lookup("k", &index));
  EXPECT_EQ(index, 1);
}

}  // namespace
}  // namespace gpu
}  // namespace trainyard
