#include "test_device_guard.h"

#include <array>
#include <atomic>
#include <chrono>

#include <c10/util/Exception.h>

namespace zero::test_device::detail {

namespace {

constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;

std::atomic<int> g_device_count{0};

thread_local c10::DeviceIndex t_current_device = 0;
// Each thread's current stream per device; 0 is the device's default stream.
thread_local std::array<c10::StreamId, kMaxDevices> t_current_stream{};

// Stream ids handed out by getNewStream / getStreamFromGlobalPool, per device.
std::array<std::atomic<c10::StreamId>, kMaxDevices> g_next_stream_id{};

// An event only remembers when and where it was recorded (elapsedTime).
struct Event {
  c10::DeviceIndex device;
  std::chrono::steady_clock::time_point recorded;
};

void check_index(c10::DeviceIndex index) {
  TORCH_CHECK(index >= 0 && index < device_count(), "zdev: device index ", static_cast<int>(index),
              " is out of range (", device_count(), " devices)");
}

c10::Stream make_stream(c10::DeviceIndex index, c10::StreamId id) {
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(kType, index), id);
}

struct GuardImpl final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kType; }

  c10::Device exchangeDevice(c10::Device d) const override {
    const c10::Device old = getDevice();
    if (d.index() != -1) setDevice(d);
    return old;
  }
  c10::Device getDevice() const override { return c10::Device(kType, current_device()); }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kType, "zdev: cannot make ", d, " the current device");
    set_current_device(d.index());
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.index() >= 0 && d.index() < device_count()) t_current_device = d.index();
  }

  c10::Stream getStream(c10::Device d) const override {
    const c10::DeviceIndex index = resolve(d.index());
    return make_stream(index, t_current_stream[index]);
  }
  c10::Stream getDefaultStream(c10::Device d) const override { return make_stream(resolve(d.index()), 0); }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool /*high_priority*/) const override {
    return getNewStream(d, 0);
  }
  c10::Stream getNewStream(c10::Device d, int /*priority*/) const override {
    const c10::DeviceIndex index = resolve(d.index());
    return make_stream(index, ++g_next_stream_id[index]);
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    const c10::DeviceIndex index = resolve(s.device_index());
    const c10::Stream old = make_stream(index, t_current_stream[index]);
    t_current_stream[index] = s.id();
    return old;
  }

  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag /*flag*/) const override {
    TORCH_CHECK(device_index == -1 || device_index == stream.device_index(), "zdev: event on device ",
                static_cast<int>(device_index), " recorded on a stream of device ",
                static_cast<int>(stream.device_index()));
    if (*event == nullptr) *event = new Event{stream.device_index(), {}};
    static_cast<Event*>(*event)->recorded = std::chrono::steady_clock::now();
  }
  void block(void* /*event*/, const c10::Stream& /*stream*/) const override {}  // its work is done
  bool queryEvent(void* /*event*/) const override { return true; }
  void destroyEvent(void* event, const c10::DeviceIndex /*device_index*/) const noexcept override {
    delete static_cast<Event*>(event);
  }
  void synchronizeEvent(void* /*event*/) const override {}
  double elapsedTime(void* start, void* end, const c10::DeviceIndex /*device_index*/) const override {
    TORCH_CHECK(start && end, "zdev: elapsedTime needs two recorded events");
    const auto d = static_cast<Event*>(end)->recorded - static_cast<Event*>(start)->recorded;
    return std::chrono::duration<double, std::milli>(d).count();
  }

  bool queryStream(const c10::Stream& /*stream*/) const override { return true; }
  void synchronizeStream(const c10::Stream& /*stream*/) const override {}
  void synchronizeDevice(const c10::DeviceIndex index) const override { check_index(resolve(index)); }
  void recordDataPtrOnStream(const c10::DataPtr& /*data_ptr*/, const c10::Stream& /*stream*/) const override {}

  c10::DeviceIndex deviceCount() const noexcept override { return static_cast<c10::DeviceIndex>(device_count()); }
};

}  // namespace

void set_device_count(int devices) { g_device_count = devices; }
int device_count() { return g_device_count.load(); }

c10::DeviceIndex current_device() { return t_current_device; }

void set_current_device(c10::DeviceIndex index) {
  check_index(index);
  t_current_device = index;
}

c10::DeviceIndex resolve(c10::DeviceIndex index) {
  if (index == -1) return t_current_device;
  check_index(index);
  return index;
}

const c10::impl::DeviceGuardImplInterface* guard_impl() {
  static const GuardImpl impl;
  return &impl;
}

}  // namespace zero::test_device::detail
