// TorchStore: torch's c10d Store (the one init_process_group hands a backend: TCPStore under
// torchrun and env://, FileStore under file://, each group's behind a PrefixStore) as a
// loom::Store, so that loom's store-built backends (ucx) meet through it as Gloo and NCCL do.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "loom/error.hpp"
#include "loom/store.hpp"

namespace loom::torch {

class TorchStore final : public Store {
 public:
  explicit TorchStore(c10::intrusive_ptr<c10d::Store> store) : _store(std::move(store)) {}

  void set(const std::string& key, std::span<const std::byte> value) override {
    std::vector<std::uint8_t> bytes(value.size());
    if (!value.empty()) std::memcpy(bytes.data(), value.data(), value.size());
    call("set", key, [&] { _store->set(key, bytes); });
  }

  std::optional<std::vector<std::byte>> try_get(const std::string& key) override {
    std::optional<std::vector<std::byte>> out;
    call("get", key, [&] {
      if (!_store->check({key})) return;
      const std::vector<std::uint8_t> bytes = _store->get(key);
      out.emplace(bytes.size());
      if (!bytes.empty()) std::memcpy(out->data(), bytes.data(), bytes.size());
    });
    return out;
  }

  std::int64_t add(const std::string& key, std::int64_t delta) override {
    std::int64_t value = 0;
    call("add", key, [&] { value = _store->add(key, delta); });
    return value;
  }

  std::string describe() const override { return "torch's store"; }

 private:
  // A store call; torch's errors (the store's host gone: a DistNetworkError) become
  // ErrorCode::unavailable naming the call and the key.
  template <class Call>
  void call(const char* what, const std::string& key, Call&& body) {
    try {
      body();
    } catch (const loom::Error&) {
      throw;
    } catch (const std::exception& e) {
      throw Error(ErrorCode::unavailable,
                  "torch's store: " + std::string(what) + " of '" + key + "' failed: " + e.what());
    }
  }

  c10::intrusive_ptr<c10d::Store> _store;
};

}  // namespace loom::torch
