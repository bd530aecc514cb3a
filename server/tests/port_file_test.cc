#include "server/port_file.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace depot {
namespace {

std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

class PortFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::filesystem::path dir_;
};

TEST_F(PortFileTest, WritesGrpcThenMetricsAddressAndNoTemporaryFile) {
  const std::filesystem::path path = dir_ / "ports";
  ASSERT_TRUE(
      WritePortFile(path.string(), "127.0.0.1:4000", "127.0.0.1:4001").ok());
  EXPECT_EQ(ReadFile(path), "127.0.0.1:4000\n127.0.0.1:4001\n");
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir_),
                          std::filesystem::directory_iterator()),
            1);
}

TEST_F(PortFileTest, OmitsTheMetricsLineWhenMetricsAreDisabled) {
  const std::filesystem::path path = dir_ / "ports";
  ASSERT_TRUE(WritePortFile(path.string(), "127.0.0.1:4000", "").ok());
  EXPECT_EQ(ReadFile(path), "127.0.0.1:4000\n");
}

TEST_F(PortFileTest, UnwritableDirectoryIsAnError) {
  EXPECT_FALSE(
      WritePortFile((dir_ / "missing" / "ports").string(), "h:1", "").ok());
}

}  // namespace
}  // namespace depot
