// src/cuda/readers.cpp — the reader threads of one load: each claims items,
// reads them (buffered pread with CRC on the fly, O_DIRECT, or a registered
// block of the mapping) into a ring slot and enqueues the copy; and the page
// cache probe that picks the I/O mode.
#include "cuda/transfer_internal.hpp"

namespace safeckpt::cuda::detail {

// Fraction of sampled pages of the file ranges that are in the page cache:
// up to 64 windows of 16 pages spread evenly over the bytes to load. Cheap
// (64 mincore calls) next to reading anything.
double page_cache_residency(const Mapping& map, std::span<const StorageSource> sources) {
  const long page_l = ::sysconf(_SC_PAGESIZE);
  const std::uint64_t page = page_l > 0 ? static_cast<std::uint64_t>(page_l) : 4096;
  std::uint64_t total = 0;
  for (const auto& s : sources)
    if (s.host_bytes == nullptr) total += s.nbytes;
  if (total == 0) return 1.0;
  constexpr int kWindows = 64;
  constexpr std::uint64_t kWindowPages = 16;
  std::uint64_t resident = 0, sampled = 0;
  unsigned char vec[kWindowPages];
  std::size_t si = 0;
  std::uint64_t base = 0;  // bytes of file ranges before sources[si]
  for (int w = 0; w < kWindows; ++w) {
    const std::uint64_t target = total / kWindows * static_cast<std::uint64_t>(w);
    while (si < sources.size() && (sources[si].host_bytes != nullptr || base + sources[si].nbytes <= target)) {
      if (sources[si].host_bytes == nullptr) base += sources[si].nbytes;
      ++si;
    }
    if (si >= sources.size()) break;
    const std::uint64_t off = align_down(sources[si].file_offset + (target - base), page);
    if (off >= map.size()) continue;
    const std::uint64_t len = std::min<std::uint64_t>(kWindowPages * page, map.size() - off);
    if (::mincore(const_cast<std::uint8_t*>(map.data()) + off, len, vec) != 0) continue;
    const std::uint64_t n = (len + page - 1) / page;
    for (std::uint64_t i = 0; i < n; ++i) resident += vec[i] & 1u;
    sampled += n;
  }
  return sampled ? static_cast<double>(resident) / static_cast<double>(sampled) : 1.0;
}

// Reads [off, off+len) of the file into dst with buffered pread, computing
// the CRC on each piece right after it lands (still in L2).
Status pread_full(int fd, std::uint8_t* dst, std::uint64_t off, std::uint64_t len, bool crc, std::uint32_t* crc_out) {
  std::uint32_t c = 0;
  std::uint64_t done = 0;
  const std::uint64_t piece = crc ? kCrcPiece : len;
  while (done < len) {
    const std::uint64_t want = std::min(piece, len - done);
    std::uint64_t got = 0;
    while (got < want) {
      const ssize_t n = ::pread(fd, dst + done + got, want - got, static_cast<off_t>(off + done + got));
      if (n < 0) {
        if (errno == EINTR) continue;
        return make_error(ErrorCode::kIo, "pread of " + std::to_string(want - got) + " bytes at file offset " +
                                              std::to_string(off + done + got) + " failed: " + errno_text(errno));
      }
      if (n == 0)
        return make_error(ErrorCode::kIo, "unexpected end of file at offset " + std::to_string(off + done + got) +
                                              " (the file shrank while loading?)");
      got += static_cast<std::uint64_t>(n);
    }
    if (crc) c = crc32_update(c, dst + done, want);
    done += want;
  }
  if (crc_out) *crc_out = c;
  return {};
}

// O_DIRECT: reads the 4096-aligned superset of [off, off+len) into dst (a
// pinned slot: page-aligned, chunk + 8 KiB long); returns the offset of the
// wanted bytes inside dst.
Result<std::uint64_t> pread_direct(int fd, std::uint8_t* dst, std::uint64_t off, std::uint64_t len) {
  const std::uint64_t begin = align_down(off, kDirectAlign);
  const std::uint64_t head = off - begin;
  const std::uint64_t need = head + len;
  const std::uint64_t span = align_up(need, kDirectAlign);
  std::uint64_t got = 0;
  while (got < need) {
    const ssize_t n = ::pread(fd, dst + got, span - got, static_cast<off_t>(begin + got));
    if (n < 0) {
      if (errno == EINTR) continue;
      return make_error(ErrorCode::kIo, "O_DIRECT pread of " + std::to_string(span - got) + " bytes at file offset " +
                                            std::to_string(begin + got) + " failed: " + errno_text(errno));
    }
    if (n == 0)
      return make_error(ErrorCode::kIo, "unexpected end of file at offset " + std::to_string(begin + got) +
                                            " (the file shrank while loading?)");
    got += static_cast<std::uint64_t>(n);
    // A short O_DIRECT read that is not block-aligned only happens at EOF.
    if (got < need && got % kDirectAlign != 0)
      return make_error(ErrorCode::kIo, "short O_DIRECT read at file offset " + std::to_string(begin + got));
  }
  return head;
}

// Enqueues the copy (and swap) of `len` host bytes at `src` to chunk c's place.
Status issue_copy(LoadState& st, const Chunk& c, const std::uint8_t* src, cudaStream_t stream) {
  const auto& s = st.sources[c.storage];
  std::uint8_t* dst = st.arena + st.layout[2 * c.storage] + c.offset;
  if (cudaError_t e = cudaMemcpyAsync(dst, src, c.len, cudaMemcpyHostToDevice, stream); e != cudaSuccess)
    return device_error("cudaMemcpyAsync of storage " + std::to_string(c.storage), e);
  st.mark_first(st.first_copy_ns);
  if (s.swap_unit > 1) {
    if (cudaError_t e = detail::launch_byteswap(dst, c.len, s.swap_unit, stream); e != cudaSuccess)
      return device_error("byte-swap kernel launch for storage " + std::to_string(c.storage), e);
  }
  return {};
}

void push_inflight(LoadState& st, InFlight f) {
  {
    std::lock_guard<std::mutex> lock(st.q_mu);
    st.queue.push_back(f);
  }
  st.q_cv.notify_one();
}

// A reader's own pageable staging buffer (pageable_staging), page-aligned for
// O_DIRECT, allocated on first use and freed when the reader exits.
struct PageableBuffer {
  std::uint8_t* p = nullptr;
  ~PageableBuffer() { std::free(p); }
};

Status run_staged_item(LoadState& st, std::uint32_t item_index, cudaStream_t stream, PageableBuffer& pageable) {
  detail::EngineState& eng = *st.eng;
  const Item& item = st.items[item_index];
  const std::uint32_t ci = st.item_chunks[item.first];
  const Chunk& c = st.chunks[ci];
  const StorageSource& src = st.sources[c.storage];
  const bool want_crc = st.checks_crc(src);

  Slot* slot = nullptr;
  std::uint8_t* buf = nullptr;
  if (!eng.opt.pageable_staging) {
    SAFECKPT_TRY(slot, eng.acquire_slot(st.failed));
    if (slot == nullptr) return {};  // stopping
    buf = slot->host;
  } else {
    if (pageable.p == nullptr) {
      pageable.p = static_cast<std::uint8_t*>(std::aligned_alloc(kDirectAlign, eng.slot_bytes));
      if (pageable.p == nullptr)
        return make_error(ErrorCode::kIo, "out of host memory for a " + std::to_string(eng.slot_bytes) +
                                              "-byte pageable staging buffer");
    }
    buf = pageable.p;
    st.pageable_chunks.fetch_add(1, std::memory_order_relaxed);
  }
  auto release = [&] {
    if (slot != nullptr) eng.release_slot(slot);
  };
  const std::uint8_t* data = buf;
  std::uint32_t crc = 0;
  Status read_status;
  if (src.host_bytes != nullptr) {
    std::memcpy(buf, src.host_bytes + c.offset, c.len);
    if (want_crc) crc = crc32_update(0, buf, c.len);
  } else if (st.mode == IoMode::kODirect) {
    auto head = pread_direct(st.file_for(c.storage).fd_direct, buf, src.file_offset + c.offset, c.len);
    if (!head) {
      read_status = std::move(head).error();
    } else {
      data = buf + *head;
      if (want_crc) crc = crc32_update(0, data, c.len);
    }
  } else {
    read_status = pread_full(st.file_for(c.storage).fd, buf, src.file_offset + c.offset, c.len, want_crc, &crc);
  }
  if (!read_status) {
    release();
    Error e = std::move(read_status).error();
    e.at_offset(src.file_offset + c.offset);
    const std::string in = st.files.size() > 1 ? " (" + st.file_for(c.storage).name + ")" : std::string();
    return unexpected(Error(e.code(), "storage " + std::to_string(c.storage) + in + ": " + e.message(), e.where()));
  }
  st.chunk_crc[ci] = crc;
  if (!st.wait_arena()) {  // the arena allocation failed: stop
    release();
    return {};
  }

  auto ev = eng.acquire_event();
  if (!ev) {
    release();
    return unexpected(std::move(ev).error());
  }
  Status issued = issue_copy(st, c, data, stream);
  if (cudaError_t e = cudaEventRecord(*ev, stream); e != cudaSuccess && issued)
    issued = device_error("cudaEventRecord", e);
  // A pageable source may still be read after cudaMemcpyAsync returns (the
  // API only says the call "might be synchronous"): wait for the copy before
  // the reader reuses its buffer.
  if (slot == nullptr && issued) {
    if (cudaError_t e = cudaEventSynchronize(*ev); e != cudaSuccess) issued = device_error("cudaEventSynchronize", e);
  }
  // Even after an error the event is queued: the completion thread waits on
  // it before the slot is reused. (If recording failed, the final stream
  // synchronization covers the copy.)
  push_inflight(st, InFlight{*ev, slot, nullptr, item_index});
  return issued;
}

Status run_registered_item(LoadState& st, std::uint32_t item_index, cudaStream_t stream) {
  detail::EngineState& eng = *st.eng;
  const Item& item = st.items[item_index];
  if (!st.wait_arena()) return {};
  {
    std::unique_lock<std::mutex> lock(st.reg_mu);
    st.reg_cv.wait(lock, [&] { return st.reg_in_flight < st.reg_max || st.failed.load(); });
    if (st.failed.load()) return {};
    ++st.reg_in_flight;
  }
  auto release_reg = [&] {
    {
      std::lock_guard<std::mutex> lock(st.reg_mu);
      --st.reg_in_flight;
    }
    st.reg_cv.notify_one();
  };
  const Mapping& map = *st.files[item.file].map;
  void* block = const_cast<std::uint8_t*>(map.data()) + item.block_begin;
  if (cudaError_t e = cudaHostRegister(block, item.block_len, cudaHostRegisterReadOnly); e != cudaSuccess) {
    release_reg();
    return device_error("cudaHostRegister of file bytes [" + std::to_string(item.block_begin) + ", +" +
                            std::to_string(item.block_len) + ")",
                        e);
  }
  Status issued;
  for (std::uint32_t k = 0; k < item.count && issued; ++k) {
    const std::uint32_t ci = st.item_chunks[item.first + k];
    const Chunk& c = st.chunks[ci];
    const std::uint8_t* src = map.data() + st.sources[c.storage].file_offset + c.offset;
    if (st.checks_crc(st.sources[c.storage])) st.chunk_crc[ci] = crc32_update(0, src, c.len);
    issued = issue_copy(st, c, src, stream);
  }
  auto ev = eng.acquire_event();
  if (!ev) {
    (void)cudaStreamSynchronize(stream);
    (void)cudaHostUnregister(block);
    release_reg();
    return unexpected(std::move(ev).error());
  }
  if (cudaError_t e = cudaEventRecord(*ev, stream); e != cudaSuccess && issued)
    issued = device_error("cudaEventRecord", e);
  push_inflight(st, InFlight{*ev, nullptr, block, item_index});
  return issued;
}

void reader_main(LoadState& st, unsigned reader_index) {
  detail::EngineState& eng = *st.eng;
  PageableBuffer pageable;
  const cudaStream_t stream = eng.streams[reader_index % eng.streams.size()];
  if (cudaError_t e = cudaSetDevice(eng.opt.device); e != cudaSuccess) {
    st.fail(device_error("cudaSetDevice", e).error);
  } else {
    while (!st.failed.load(std::memory_order_relaxed)) {
      const std::size_t i = st.next_item.fetch_add(1, std::memory_order_relaxed);
      if (i >= st.items.size()) break;
      const auto idx = static_cast<std::uint32_t>(i);
      Status s =
          st.items[i].registered ? run_registered_item(st, idx, stream) : run_staged_item(st, idx, stream, pageable);
      if (!s) {
        st.fail(std::move(s).error());
        break;
      }
    }
  }
  {
    std::lock_guard<std::mutex> lock(st.q_mu);
    --st.readers_running;
  }
  st.q_cv.notify_all();
}

}  // namespace safeckpt::cuda::detail
