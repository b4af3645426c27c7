// src/cuda/completion.cpp — the completion thread of one load: waits on each
// item's event in submission order, returns its slot (or unregisters its
// block), checks a storage's CRC when its last chunk lands, reports it ready.
#include "cuda/transfer_internal.hpp"

namespace safeckpt::cuda::detail {

// Storage s has all its chunks on the device: check its CRC, report it.
// Empty storages are complete at the start and do not count as "first".
void storage_complete(LoadState& st, std::uint32_t s) {
  const StorageSource& src = st.sources[s];
  if (st.checks_crc(src)) {
    std::uint32_t crc = 0;
    bool first = true;
    for (std::uint32_t ci = st.storage_first_chunk[s]; ci < st.storage_first_chunk[s + 1]; ++ci) {
      const Chunk& c = st.chunks[ci];
      crc = first ? st.chunk_crc[ci]
                  : static_cast<std::uint32_t>(crc32_combine(crc, st.chunk_crc[ci], static_cast<z_off_t>(c.len)));
      first = false;
    }
    if (crc != src.expected_crc32) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "storage %u: CRC-32 mismatch: expected %08x, computed %08x over %llu bytes", s,
                    src.expected_crc32, crc, static_cast<unsigned long long>(src.nbytes));
      Error e(ErrorCode::kMalformed, buf);
      if (src.host_bytes == nullptr) e.at_offset(src.file_offset);
      if (src.host_bytes == nullptr && st.files.size() > 1) e.at_record(st.file_for(s).name);
      st.fail(std::move(e));
      return;
    }
  }
  if (src.nbytes > 0) st.mark_first(st.first_ready_ns);
  if (st.eng->opt.on_storage_ready && !st.failed.load()) st.eng->opt.on_storage_ready(s);
  if (st.on_ready != nullptr && *st.on_ready && !st.failed.load()) (*st.on_ready)(s);
}

void completion_main(LoadState& st) {
  detail::EngineState& eng = *st.eng;
  const bool device_ok = cudaSetDevice(eng.opt.device) == cudaSuccess;
  for (;;) {
    InFlight f;
    {
      std::unique_lock<std::mutex> lock(st.q_mu);
      st.q_cv.wait(lock, [&] { return !st.queue.empty() || st.readers_running == 0; });
      if (st.queue.empty()) break;  // readers done and nothing left
      f = st.queue.front();
      st.queue.pop_front();
    }
    cudaError_t err = device_ok ? cudaEventSynchronize(f.event) : cudaErrorInvalidDevice;
    if (err != cudaSuccess) st.fail(device_error("waiting for a copy (cudaEventSynchronize)", err).error);
    if (f.registered != nullptr) {
      if (cudaError_t e = cudaHostUnregister(f.registered); e != cudaSuccess)
        st.fail(device_error("cudaHostUnregister", e).error);
      {
        std::lock_guard<std::mutex> lock(st.reg_mu);
        --st.reg_in_flight;
      }
      st.reg_cv.notify_one();
    }
    eng.release_event(f.event);
    if (f.slot != nullptr) eng.release_slot(f.slot);
    if (err != cudaSuccess) continue;
    const Item& item = st.items[f.item];
    for (std::uint32_t k = 0; k < item.count; ++k) {
      const Chunk& c = st.chunks[st.item_chunks[item.first + k]];
      if (st.remaining[c.storage].fetch_sub(1, std::memory_order_acq_rel) == 1 && !st.failed.load())
        storage_complete(st, c.storage);
    }
  }
}

}  // namespace safeckpt::cuda::detail
