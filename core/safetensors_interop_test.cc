// Interop with the reference implementation: the Python `safetensors`
// package (with PyTorch) under Debian's /usr/bin/python3 must read what we
// write, and we must read what it writes. Skips, printing why, when that
// Python lacks safetensors or torch (setup: see docs/CHECKPOINT_FORMAT.md).
#include <sys/wait.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/file_util.h"
#include "core/safetensors.h"
#include "gtest/gtest.h"

namespace trainyard {
namespace {

constexpr char kPython[] = "/usr/bin/python3";

std::string TmpPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return JoinPath(dir != nullptr ? dir : "/tmp", name);
}

// Runs `script` with Debian's python; returns its exit code.
int RunPython(const std::string& script) {
  std::string path = TmpPath("interop.py");
  if (!WriteFileAtomically(path, script).ok()) return -1;
  int rc = std::system(absl::StrCat(kPython, " ", path).c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

class SafetensorsInteropTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (RunPython("import safetensors.torch, torch\n") != 0) {
      GTEST_SKIP() << "SKIPPED: " << kPython
                   << " cannot import safetensors.torch and torch; install "
                      "with `apt-get install -y python3-torch python3-pip && "
                      "/usr/bin/python3 -m pip install "
                      "--break-system-packages safetensors`";
    }
  }
};

TEST_F(SafetensorsInteropTest, PythonReadsWhatWeWrite) {
  SafetensorsFile f;
  f.tensors.emplace_back(
      "blocks.0.fc1.weight",
      Tensor::FromVector({1.5f, -2.f, 0.25f, 3e-8f, -0.f, 7.f}, {2, 3}));
  Tensor bf = Tensor::Empty(DType::kBFloat16, {2});
  bf.data<uint16_t>()[0] = 0x3FC0;  // 1.5
  bf.data<uint16_t>()[1] = 0xC040;  // -3.0
  f.tensors.emplace_back("bf", bf);
  Tensor i32 = Tensor::Empty(DType::kInt32, {3});
  for (int i = 0; i < 3; ++i) i32.data<int32_t>()[i] = -1000 + i;
  f.tensors.emplace_back("i32", i32);
  Tensor i64 = Tensor::Empty(DType::kInt64, {});
  i64.data<int64_t>()[0] = int64_t{1} << 40;
  f.tensors.emplace_back("i64", i64);
  Tensor u8 = Tensor::Empty(DType::kUInt8, {3});
  u8.data<uint8_t>()[0] = 0;
  u8.data<uint8_t>()[1] = 128;
  u8.data<uint8_t>()[2] = 255;
  f.tensors.emplace_back("task.state", u8);
  f.metadata["step"] = "42";
  std::string path = TmpPath("ours.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, f).ok());
  int rc = RunPython(absl::StrCat(R"(
import sys, torch
from safetensors import safe_open
from safetensors.torch import load_file
path = ")",
                                  path, R"("
t = load_file(path)
def check(name, dtype, values):
    x = t[name]
    assert x.dtype == dtype, (name, x.dtype)
    want = torch.tensor(values, dtype=dtype)
    assert x.shape == want.shape, (name, x.shape, want.shape)
    assert torch.equal(x, want), (name, x, want)
check("blocks.0.fc1.weight", torch.float32, [[1.5, -2.0, 0.25], [3e-8, -0.0, 7.0]])
check("bf", torch.bfloat16, [1.5, -3.0])
check("i32", torch.int32, [-1000, -999, -998])
check("i64", torch.int64, 1 << 40)
check("task.state", torch.uint8, [0, 128, 255])
assert sorted(t) == sorted(["blocks.0.fc1.weight", "bf", "i32", "i64", "task.state"])
with safe_open(path, framework="pt") as f:
    assert f.metadata() == {"step": "42"}, f.metadata()
print("python read our file OK")
)"));
  EXPECT_EQ(rc, 0) << "python failed to read " << path << " (see log above)";
}

TEST_F(SafetensorsInteropTest, WeReadWhatPythonWrites) {
  std::string path = TmpPath("theirs.safetensors");
  int rc = RunPython(
      absl::StrCat(R"(
import torch
from safetensors.torch import save_file
save_file({
    "w": torch.arange(12, dtype=torch.float32).reshape(3, 4) / 8 - 0.5,
    "bf": torch.tensor([1.5, -3.0], dtype=torch.bfloat16),
    "ids": torch.tensor([-5, 6], dtype=torch.int64),
    "i32": torch.tensor([[7]], dtype=torch.int32),
    "bytes": torch.tensor([1, 2, 250], dtype=torch.uint8),
}, ")",
                   path, R"(", metadata={"step": "9", "data_position": "1234"})
)"));
  ASSERT_EQ(rc, 0) << "python failed to write " << path;
  auto f = ReadSafetensors(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->tensors.size(), 5u);
  EXPECT_EQ(f->metadata.at("step"), "9");
  EXPECT_EQ(f->metadata.at("data_position"), "1234");
  auto w = f->Get("w");
  ASSERT_TRUE(w.ok());
  ASSERT_EQ(w->shape(), (Shape{3, 4}));
  for (int i = 0; i < 12; ++i) EXPECT_EQ(w->data<float>()[i], i / 8.f - 0.5f);
  auto bf = f->Get("bf");
  ASSERT_TRUE(bf.ok());
  EXPECT_EQ(bf->dtype(), DType::kBFloat16);
  EXPECT_EQ(bf->data<uint16_t>()[0], 0x3FC0);
  EXPECT_EQ(bf->data<uint16_t>()[1], 0xC040);
  auto ids = f->Get("ids");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ids->data<int64_t>()[0], -5);
  EXPECT_EQ(ids->data<int64_t>()[1], 6);
  auto i32 = f->Get("i32");
  ASSERT_TRUE(i32.ok());
  EXPECT_EQ(i32->shape(), (Shape{1, 1}));
  EXPECT_EQ(i32->data<int32_t>()[0], 7);
  auto bytes = f->Get("bytes");
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(bytes->data<uint8_t>()[2], 250);
  // Re-serialising what Python wrote and reading it back is lossless.
  auto again = ParseSafetensors(SerializeSafetensors(*f), "reserialised");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->tensors.size(), 5u);
}

}  // namespace
}  // namespace trainyard
