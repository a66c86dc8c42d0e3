// The CUDA IPC direct path's cache of peers' mappings (comm/cuda/ipc_buffers.h),
// with a fake opener over host memory: no GPU needed. What a GPU adds (the
// handles themselves) runs in the device suite at a lease.
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "comm/cuda/ipc_buffers.h"

namespace {

using zero::comm::cuda::DeviceBufferRef;
using zero::comm::cuda::PeerDeviceBuffers;

// Each handle opens its own 64-byte host block; opens and closes counted.
struct FakeDriver {
  std::map<std::string, int> opens, closes;
  PeerDeviceBuffers::Opener opener() {
    return [this](const std::string& handle) -> std::shared_ptr<void> {
      if (handle == "refused") throw std::runtime_error("cudaIpcOpenMemHandle: invalid argument\nmore");
      ++opens[handle];
      return std::shared_ptr<void>(new char[64], [this, handle](void* p) {
        ++closes[handle];
        delete[] static_cast<char*>(p);
      });
    };
  }
};

DeviceBufferRef buffer_ref(const std::string& handle, int64_t offset = 0, uint32_t frees = 0) {
  DeviceBufferRef r;
  r.shareable = 1;
  r.handle_bytes = static_cast<uint8_t>(handle.size());
  r.owner_frees = frees;
  r.offset = offset;
  handle.copy(r.handle, handle.size());
  return r;
}

TEST(PeerDeviceBuffers, OpensEachHandleOnceAndOffsetsIntoIt) {
  FakeDriver driver;
  PeerDeviceBuffers peers(driver.opener());
  const char* a = peers.data(1, buffer_ref("seg-a", 8));
  EXPECT_EQ(peers.data(1, buffer_ref("seg-a", 24)), a + 16);
  EXPECT_EQ(driver.opens["seg-a"], 1);
  peers.data(2, buffer_ref("seg-a"));  // another peer's handle of the same bytes: its own entry
  EXPECT_EQ(peers.cached(), 2u);
  peers.close_all();
  EXPECT_EQ(peers.cached(), 0u);
  EXPECT_EQ(driver.closes["seg-a"], 2);
}

TEST(PeerDeviceBuffers, AnOwnersFreedSegmentDropsWhatIsCachedOfThatOwnerOnly) {
  FakeDriver driver;
  PeerDeviceBuffers peers(driver.opener());
  peers.data(1, buffer_ref("p1-x", 0, 5));
  peers.data(1, buffer_ref("p1-y", 0, 5));
  peers.data(2, buffer_ref("p2-x", 0, 9));
  peers.data(1, buffer_ref("p1-x", 0, 6));  // peer 1 freed a segment since: both of its closed, then x reopened
  EXPECT_EQ(driver.closes["p1-x"], 1);
  EXPECT_EQ(driver.closes["p1-y"], 1);
  EXPECT_EQ(driver.opens["p1-x"], 2);
  EXPECT_EQ(driver.closes["p2-x"], 0);
  EXPECT_EQ(peers.cached(), 2u);
}

TEST(PeerDeviceBuffers, TheLeastRecentlyUsedGoesPastTheBound) {
  FakeDriver driver;
  PeerDeviceBuffers peers(driver.opener());
  for (size_t i = 0; i < PeerDeviceBuffers::kMaxCached; ++i) peers.data(1, buffer_ref("h" + std::to_string(i)));
  peers.data(1, buffer_ref("h0"));  // used again: now the most recent
  peers.data(1, buffer_ref("new"));
  EXPECT_EQ(peers.cached(), PeerDeviceBuffers::kMaxCached);
  EXPECT_EQ(driver.closes["h0"], 0);
  EXPECT_EQ(driver.closes["h1"], 1);
  EXPECT_EQ(driver.opens["h0"], 1);
}

TEST(PeerDeviceBuffers, AHandleThatWillNotOpenNamesThePeer) {
  FakeDriver driver;
  PeerDeviceBuffers peers(driver.opener());
  try {
    peers.data(3, buffer_ref("refused"));
    ADD_FAILURE() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), "opening rank 3's device buffer (CUDA IPC): cudaIpcOpenMemHandle: invalid argument");
  }
  EXPECT_EQ(peers.cached(), 0u);
}

}  // namespace
