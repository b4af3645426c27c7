// src/cuda/transfer.cpp — the transfer engine: file ranges -> pinned ring ->
// cudaMemcpyAsync, overlapped (see safeckpt/cuda.hpp for the contract).
//
// Accepted input (everything else is an error before any device work):
//   1. sources.size() < 2^32; swap_unit in {1, 2, 4, 8}; nbytes % swap_unit == 0;
//   2. a file range has file_offset + nbytes <= file size (no overflow);
//   3. a source with host_bytes needs no file; a non-empty file range needs one;
//      load_into: its file index names one of `files`, its destination lies in
//      the caller's memory, does not overlap another's, is swap-aligned;
//   4. options: chunk_bytes a multiple of 4096 in [64 KiB, 1 GiB];
//      chunk_bytes <= ring_bytes <= 16 GiB; 1..256 readers; 1..64 streams.
//
// Work is cut into items. A staged item is one chunk (<= chunk_bytes) of one
// storage, read into a ring slot. A registered item (kMmapRegister) is one
// page-aligned block of the mapped file, registered with cudaHostRegister and
// copied from directly; it carries the pieces of every storage inside it.
// Items are issued in storage order so the first storages complete first.
//
// Threads: per engine, one ring thread (prepare_ring, from create()) pins the
// staging ring slot by slot with helper threads touching its pages first.
// Per load, `readers` reader threads claim items with an atomic counter and
// wait for the arena (cudaMalloc'd by the calling thread meanwhile) before
// their first copy; one completion thread waits on each item's event in
// submission order, returns its slot (or unregisters its block), checks a
// storage's CRC when its last chunk completes and reports it ready. Any
// error sets `failed`; readers stop claiming, the completion thread drains
// what was issued, every stream is synchronized, then the arena is freed.

#include "cuda/transfer_internal.hpp"

namespace safeckpt::cuda {

using namespace detail;  // the engine internals (transfer_internal.hpp)

// load(): one file, an arena allocated here (load_impl below).
Result<DeviceArena> TransferEngine::load_from(const std::filesystem::path& file, int given_fd,
                                              std::span<const StorageSource> sources, LoadStats* stats) {
  const LoadInput in[1] = {LoadInput{file, given_fd}};
  return load_impl(in, sources, {}, nullptr, stats);
}

Status TransferEngine::load_into(std::span<const MappedFile* const> files, std::span<const PlacedSource> sources,
                                 void* device_base, std::uint64_t device_bytes, LoadStats* stats,
                                 const std::function<void(std::size_t)>& on_storage_ready) {
  std::vector<LoadInput> in;
  in.reserve(files.size());
  for (const MappedFile* f : files) {
    if (f == nullptr) return make_error(ErrorCode::kInvalidArgument, "load_into: a null file");
    in.push_back(LoadInput{f->path(), f->fd()});
  }
  std::vector<StorageSource> srcs;
  std::vector<std::uint32_t> file_of;
  std::vector<std::uint64_t> offsets;
  srcs.reserve(sources.size());
  file_of.reserve(sources.size());
  offsets.reserve(sources.size());
  for (std::size_t i = 0; i < sources.size(); ++i) {
    const PlacedSource& p = sources[i];
    const bool reads_file = p.source.host_bytes == nullptr && p.source.nbytes > 0;
    if (reads_file && p.file >= files.size())
      return make_error(ErrorCode::kInvalidArgument, "load_into: storage " + std::to_string(i) + " names file " +
                                                         std::to_string(p.file) + " of " +
                                                         std::to_string(files.size()));
    if (reads_file && files[p.file]->fd() < 0)
      return make_error(ErrorCode::kInvalidArgument,
                        "load_into: storage " + std::to_string(i) + " is a file range of a file without a descriptor");
    srcs.push_back(p.source);
    file_of.push_back(reads_file ? p.file : 0);
    offsets.push_back(p.device_offset);
  }
  if (in.empty()) in.push_back(LoadInput{});
  Placement placed{static_cast<std::uint8_t*>(device_base), device_bytes, offsets, &on_storage_ready};
  SAFECKPT_TRY(DeviceArena none, load_impl(in, srcs, file_of, &placed, stats));
  (void)none;
  return {};
}

// One load() or load_into(). Each input file is `fd` when >= 0 (borrowed: the
// descriptor the host loader validated, MappedFile::fd()), else `path` opened
// here once. Either way every read of this load uses that one open file:
// buffered pread on it, its own MAP_SHARED mapping of it, and for O_DIRECT a
// reopen of /proc/self/fd/N, which yields a new open file description of the
// SAME inode (not a lookup of the path name, which may have been replaced).
Result<DeviceArena> TransferEngine::load_impl(std::span<const LoadInput> inputs, std::span<const StorageSource> sources,
                                              std::span<const std::uint32_t> file_of, const Placement* placed,
                                              LoadStats* stats) {
  detail::EngineState& eng = *impl_;
  std::lock_guard<std::mutex> load_lock(eng.load_mu);
  DeviceGuard guard;  // the caller's current device is restored on return
  LoadState st;
  st.start = Clock::now();
  st.eng = &eng;
  st.sources = sources;
  st.file_of = file_of;
  st.on_ready = placed != nullptr ? placed->on_ready : nullptr;
  st.verify = eng.opt.verify_crc;
  const auto file_index = [&](std::size_t i) -> std::uint32_t { return file_of.empty() ? 0 : file_of[i]; };

  // 1. Validate the request (no device work yet).
  if (sources.size() >= (std::size_t{1} << 32) - 1)
    return make_error(ErrorCode::kInvalidArgument, "too many storages: " + std::to_string(sources.size()));
  std::vector<char> needed(inputs.size(), 0);
  bool need_file = false;
  for (std::size_t i = 0; i < sources.size(); ++i) {
    const auto& s = sources[i];
    if (s.swap_unit != 1 && s.swap_unit != 2 && s.swap_unit != 4 && s.swap_unit != 8)
      return make_error(
          ErrorCode::kInvalidArgument,
          "storage " + std::to_string(i) + ": swap_unit must be 1, 2, 4 or 8, got " + std::to_string(s.swap_unit));
    if (s.nbytes % s.swap_unit != 0)
      return make_error(ErrorCode::kInvalidArgument, "storage " + std::to_string(i) + ": " + std::to_string(s.nbytes) +
                                                         " bytes is not a multiple of swap_unit " +
                                                         std::to_string(s.swap_unit));
    if (s.host_bytes == nullptr && s.nbytes > 0) {
      need_file = true;
      if (file_index(i) >= inputs.size())
        return make_error(ErrorCode::kInvalidArgument, "storage " + std::to_string(i) + ": no such file");
      needed[file_index(i)] = 1;
      if (s.file_offset > UINT64_MAX - s.nbytes)
        return make_error(ErrorCode::kInvalidArgument,
                          "storage " + std::to_string(i) + ": file_offset + nbytes overflows");
    }
  }
  if (placed != nullptr) {
    if (placed->offsets.size() != sources.size())
      return make_error(ErrorCode::kInternal, "load_into: one offset per source expected");
    std::vector<std::uint32_t> order;
    for (std::size_t i = 0; i < sources.size(); ++i) {
      const std::uint64_t off = placed->offsets[i], nb = sources[i].nbytes;
      if (nb == 0) continue;
      if (placed->base == nullptr)
        return make_error(ErrorCode::kInvalidArgument, "load_into: no device memory (null device_base)");
      if (off > placed->bytes || nb > placed->bytes - off)
        return make_error(ErrorCode::kInvalidArgument, "load_into: storage " + std::to_string(i) + " lands at [" +
                                                           std::to_string(off) + ", +" + std::to_string(nb) +
                                                           "), outside the " + std::to_string(placed->bytes) +
                                                           " bytes of device memory");
      if ((reinterpret_cast<std::uintptr_t>(placed->base) + off) % sources[i].swap_unit != 0)
        return make_error(ErrorCode::kInvalidArgument, "load_into: storage " + std::to_string(i) +
                                                           " is byte-swapped to an address that is not a multiple "
                                                           "of its swap unit");
      order.push_back(static_cast<std::uint32_t>(i));
    }
    std::sort(order.begin(), order.end(),
              [&](std::uint32_t a, std::uint32_t b) { return placed->offsets[a] < placed->offsets[b]; });
    for (std::size_t k = 1; k < order.size(); ++k) {
      const std::uint32_t a = order[k - 1], b = order[k];
      if (placed->offsets[a] + sources[a].nbytes > placed->offsets[b])
        return make_error(ErrorCode::kInvalidArgument, "load_into: storages " + std::to_string(a) + " and " +
                                                           std::to_string(b) + " overlap on the device");
    }
  }

  // 2. Open the files; pick the I/O mode (one for the whole load).
  std::vector<Fd> fds(inputs.size()), fds_direct(inputs.size());
  std::vector<std::unique_ptr<Mapping>> maps(inputs.size());
  st.files.resize(inputs.size());
  st.mode = eng.opt.io_mode;
  const auto where = [&](std::size_t f) { return inputs[f].path.string(); };
  if (need_file) {
    std::vector<struct stat> sbs(inputs.size());
    for (std::size_t f = 0; f < inputs.size(); ++f) {
      if (!needed[f]) continue;
      const std::filesystem::path& file = inputs[f].path;
      int the_fd = inputs[f].fd;
      if (the_fd < 0) {
        if (file.empty())
          return make_error(ErrorCode::kInvalidArgument, "a storage is a file range but no file was given");
        fds[f] = Fd(::open(file.c_str(), O_RDONLY | O_CLOEXEC));
        if (fds[f].get() < 0)
          return make_error(ErrorCode::kIo, "open " + file.string() + ": " + errno_text(errno),
                            Location{file.string()});
        the_fd = fds[f].get();
      }
      struct stat& sb = sbs[f];
      if (::fstat(the_fd, &sb) != 0)
        return make_error(ErrorCode::kIo, "fstat " + file.string() + ": " + errno_text(errno), Location{file.string()});
      if (!S_ISREG(sb.st_mode))
        return make_error(ErrorCode::kIo, file.string() + " is not a regular file", Location{file.string()});
      st.files[f].fd = the_fd;
      st.files[f].size = static_cast<std::uint64_t>(sb.st_size);
      st.files[f].name = file.filename().string();
    }
    for (std::size_t i = 0; i < sources.size(); ++i) {
      const auto& s = sources[i];
      if (s.host_bytes != nullptr || s.nbytes == 0) continue;
      const std::uint64_t size = st.files[file_index(i)].size;
      if (s.file_offset > size || s.nbytes > size - s.file_offset)
        return make_error(ErrorCode::kMalformed,
                          "storage " + std::to_string(i) + ": bytes [" + std::to_string(s.file_offset) + ", " +
                              std::to_string(s.file_offset + s.nbytes) + ") end past the end of the file (" +
                              std::to_string(size) + " bytes)",
                          Location{where(file_index(i)), s.file_offset, {}});
    }
    const bool want_map = st.mode == IoMode::kAuto || st.mode == IoMode::kMmapRegister;
    bool all_mapped = want_map;
    for (std::size_t f = 0; f < inputs.size() && want_map; ++f) {
      if (!needed[f]) continue;
      maps[f] = std::make_unique<Mapping>();
      if (maps[f]->map(st.files[f].fd, st.files[f].size)) {
        st.files[f].map = maps[f].get();
      } else {
        all_mapped = false;
      }
    }
    if (st.mode == IoMode::kMmapRegister && (!all_mapped || !eng.can_register_read_only)) st.mode = IoMode::kPread;
    if (st.mode == IoMode::kMmapRegister) {
      // Some kernels / file systems refuse to pin file pages; find out with
      // one page of each file rather than failing midway.
      (void)cudaSetDevice(eng.opt.device);
      for (std::size_t f = 0; f < inputs.size() && st.mode == IoMode::kMmapRegister; ++f) {
        if (!needed[f]) continue;
        const Mapping& map = *st.files[f].map;
        void* probe = const_cast<std::uint8_t*>(map.data());
        if (cudaHostRegister(probe, std::min<std::uint64_t>(map.size(), kDirectAlign), cudaHostRegisterReadOnly) ==
            cudaSuccess) {
          (void)cudaHostUnregister(probe);
        } else {
          (void)cudaGetLastError();
          st.mode = IoMode::kPread;
        }
      }
    }
    if (st.mode == IoMode::kAuto) {
      // Sampled page-cache residency of every file's ranges, weighted by bytes.
      double resident = 0, total = 0;
      bool probed = all_mapped;
      for (std::size_t f = 0; f < inputs.size() && probed; ++f) {
        if (!needed[f]) continue;
        std::vector<StorageSource> mine;
        double bytes = 0;
        for (std::size_t i = 0; i < sources.size(); ++i)
          if (sources[i].host_bytes == nullptr && sources[i].nbytes > 0 && file_index(i) == f) {
            mine.push_back(sources[i]);
            bytes += static_cast<double>(sources[i].nbytes);
          }
        resident += page_cache_residency(*st.files[f].map, mine) * bytes;
        total += bytes;
      }
      st.mode = (probed && total > 0 && resident / total < 0.5) ? IoMode::kODirect : IoMode::kPread;
    }
    if (st.mode == IoMode::kODirect) {
      for (std::size_t f = 0; f < inputs.size() && st.mode == IoMode::kODirect; ++f) {
        if (!needed[f]) continue;
        // Same inode as the file's descriptor (see above); never the path name again.
        const std::string self = "/proc/self/fd/" + std::to_string(st.files[f].fd);
        fds_direct[f] = Fd(::open(self.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT));
        if (fds_direct[f].get() >= 0) {
          struct stat db {};
          if (::fstat(fds_direct[f].get(), &db) != 0 || db.st_dev != sbs[f].st_dev || db.st_ino != sbs[f].st_ino)
            fds_direct[f].reset();
        }
        if (fds_direct[f].get() < 0) st.mode = IoMode::kPread;  // e.g. tmpfs: EINVAL; no /proc
        st.files[f].fd_direct = fds_direct[f].get();
      }
    }
  } else if (st.mode == IoMode::kAuto) {
    st.mode = IoMode::kPread;
  }

  // 3. Plan: arena layout, chunks, items.
  const std::size_t n = sources.size();
  auto layout = std::make_unique<std::uint64_t[]>(2 * n + 1);
  std::uint64_t total = 0, bytes = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t nb = sources[i].nbytes;
    bytes += nb;
    layout[2 * i + 1] = nb;
    if (placed != nullptr) {  // checked in step 1
      layout[2 * i] = placed->offsets[i];
      continue;
    }
    const std::uint64_t off = align_up(total, kArenaAlignment);
    if (off < total || off > UINT64_MAX - nb)
      return make_error(ErrorCode::kInvalidArgument, "total storage bytes overflow");
    layout[2 * i] = off;
    total = off + nb;
  }
  const std::uint64_t chunk = eng.opt.chunk_bytes;
  st.storage_first_chunk.resize(n + 1);
  st.remaining = std::make_unique<std::atomic<std::uint32_t>[]>(n);
  for (std::size_t i = 0; i < n; ++i) {
    st.storage_first_chunk[i] = static_cast<std::uint32_t>(st.chunks.size());
    const auto& s = sources[i];
    const bool registered =
        st.mode == IoMode::kMmapRegister && s.host_bytes == nullptr && s.file_offset % s.swap_unit == 0;
    // Registered storages are cut at block boundaries (file offsets), staged
    // ones every `chunk` bytes from their start.
    const std::uint64_t block = 4 * chunk;
    std::uint64_t off = 0;
    std::uint32_t count = 0;
    while (off < s.nbytes) {
      std::uint64_t len = std::min(chunk, s.nbytes - off);
      if (registered) {
        const std::uint64_t pos = s.file_offset + off;
        len = std::min(s.nbytes - off, align_down(pos, block) + block - pos);
      }
      if (st.chunks.size() >= UINT32_MAX - 1)
        return make_error(ErrorCode::kInvalidArgument, "too many chunks; raise chunk_bytes");
      st.chunks.push_back(Chunk{static_cast<std::uint32_t>(i), off, len});
      off += len;
      ++count;
    }
    st.remaining[i].store(count);
  }
  st.storage_first_chunk[n] = static_cast<std::uint32_t>(st.chunks.size());
  st.chunk_crc.assign(st.chunks.size(), 0);
  st.item_chunks.reserve(st.chunks.size());
  if (st.mode == IoMode::kMmapRegister) {
    // Group registered pieces by file block, staged ones one per item; items
    // sorted by the position of their first byte in storage order.
    const std::uint64_t block = 4 * chunk;
    struct Key {
      std::uint64_t block;  // UINT64_MAX for staged
      std::uint32_t file;
      std::uint32_t chunk;
    };
    std::vector<Key> keys;
    keys.reserve(st.chunks.size());
    for (std::uint32_t ci = 0; ci < st.chunks.size(); ++ci) {
      const Chunk& c = st.chunks[ci];
      const auto& s = sources[c.storage];
      const bool registered = s.host_bytes == nullptr && s.file_offset % s.swap_unit == 0;
      keys.push_back(Key{registered ? (s.file_offset + c.offset) / block : UINT64_MAX,
                         registered ? file_index(c.storage) : 0, ci});
    }
    // Blocks in (file, block) order; staged items first, in storage order.
    std::vector<Key> by_block;
    for (const Key& k : keys) {
      if (k.block == UINT64_MAX) {
        st.items.push_back(Item{static_cast<std::uint32_t>(st.item_chunks.size()), 1, false, 0, 0});
        st.item_chunks.push_back(k.chunk);
        continue;
      }
      by_block.push_back(k);
    }
    std::stable_sort(by_block.begin(), by_block.end(),
                     [](const Key& a, const Key& b) { return a.file != b.file ? a.file < b.file : a.block < b.block; });
    for (std::size_t j = 0; j < by_block.size();) {
      std::size_t k = j;
      const std::uint32_t f = by_block[j].file;
      const std::uint64_t mapped_end = align_up(st.files[f].size, kDirectAlign);
      Item item{static_cast<std::uint32_t>(st.item_chunks.size()), 0, true, by_block[j].block * block, 0, f};
      item.block_len = std::min(block, mapped_end - item.block_begin);
      while (k < by_block.size() && by_block[k].file == f && by_block[k].block == by_block[j].block) {
        st.item_chunks.push_back(by_block[k].chunk);
        ++item.count;
        ++k;
      }
      st.items.push_back(item);
      j = k;
    }
    st.reg_max = 2 * static_cast<std::size_t>(eng.readers);
  } else {
    for (std::uint32_t ci = 0; ci < st.chunks.size(); ++ci) {
      st.items.push_back(Item{ci, 1, false, 0, 0});
      st.item_chunks.push_back(ci);
    }
  }

  // 4. The arena object (allocated in step 5, while the first reads run).
  if (cudaError_t e = cudaSetDevice(eng.opt.device); e != cudaSuccess) return device_error("cudaSetDevice", e);
  DeviceArena arena;
  arena.device_ = eng.opt.device;
  arena.count_ = placed != nullptr ? 0 : n;
  st.layout = layout.get();
  if (placed == nullptr) arena.layout_ = std::move(layout);
  {
    std::lock_guard<std::mutex> lock(eng.ring_mu);
    eng.peak_in_use = eng.in_use;
    eng.slots_pinned_now = 0;
    eng.pin_seconds_now = 0;
  }
  // cudaMalloc of the arena, on this thread once the readers have started:
  // 0.5-3 ms for 6 GiB on the H200 machine, hidden behind the first reads
  // (~1.5 ms for 16 x 4 MiB). Readers wait for it before their first copy.
  double alloc_seconds = 0;
  auto allocate_arena = [&] {
    const auto alloc_start = Clock::now();
    if (placed != nullptr) {
      st.arena = placed->base;
    } else if (total > 0 && !st.failed.load()) {
      void* base = nullptr;
      if (cudaError_t e = cudaMalloc(&base, total); e != cudaSuccess) {
        (void)cudaGetLastError();
        st.fail(
            device_error("cudaMalloc of " + std::to_string(total) + " bytes for " + std::to_string(n) + " storages", e)
                .error);
      } else {
        arena.base_ = base;
        arena.size_ = total;
        st.arena = static_cast<std::uint8_t*>(base);
      }
    }
    alloc_seconds = std::chrono::duration<double>(Clock::now() - alloc_start).count();
    if (!st.failed.load()) st.publish_arena();
  };

  // Empty storages are complete at once.
  for (std::size_t i = 0; i < n; ++i)
    if (sources[i].nbytes == 0) storage_complete(st, static_cast<std::uint32_t>(i));

  // 5. Run: readers + completion thread.
  const unsigned nreaders =
      static_cast<unsigned>(std::min<std::size_t>(eng.readers, std::max<std::size_t>(1, st.items.size())));
  if (!st.items.empty() && !st.failed.load()) {
    st.readers_running = nreaders;
    std::vector<std::thread> threads;
    threads.reserve(nreaders);
    std::thread completion;
    try {
      completion = std::thread([&st] { completion_main(st); });
      for (unsigned r = 0; r < nreaders; ++r) threads.emplace_back([&st, r] { reader_main(st, r); });
    } catch (const std::system_error& e) {
      // Could not start a thread: stop, and account for readers never started.
      {
        std::lock_guard<std::mutex> lock(st.q_mu);
        st.readers_running -= nreaders - static_cast<unsigned>(threads.size());
      }
      st.fail(Error(ErrorCode::kIo, std::string("could not start a loader thread: ") + e.what()));
    }
    allocate_arena();
    for (auto& t : threads) t.join();
    if (completion.joinable()) {
      completion.join();
    } else {
      completion_main(st);  // drain on this thread
    }
  } else {
    allocate_arena();  // nothing to read (every storage empty) or already failed
  }
  // Everything issued has been waited for by the completion thread; make sure
  // of it (and of copies whose event could not be recorded) before the arena
  // can be freed or the slots reused.
  for (auto s : eng.streams) {
    if (cudaError_t e = cudaStreamSynchronize(s); e != cudaSuccess && !st.failed.load())
      st.fail(device_error("cudaStreamSynchronize", e).error);
  }

  const auto end = Clock::now();
  if (stats) {
    *stats = LoadStats{};
    stats->bytes = bytes;
    stats->arena_bytes = total;
    stats->seconds = std::chrono::duration<double>(end - st.start).count();
    const std::int64_t first = st.first_ready_ns.load();
    stats->seconds_to_first_storage = first >= 0 ? static_cast<double>(first) * 1e-9 : stats->seconds;
    const std::int64_t first_copy = st.first_copy_ns.load();
    stats->seconds_to_first_copy = first_copy >= 0 ? static_cast<double>(first_copy) * 1e-9 : 0;
    {
      std::lock_guard<std::mutex> lock(eng.ring_mu);
      stats->peak_ring_bytes = eng.peak_in_use * eng.slot_bytes;
      stats->slots_pinned = eng.slots_pinned_now;
      stats->seconds_pinning = eng.pin_seconds_now;
      stats->seconds_ring_ready = eng.preparing ? 0 : eng.ring_ready_seconds;
    }
    stats->seconds_device_alloc = alloc_seconds;
    stats->pageable_chunks = st.pageable_chunks.load();
    stats->ring_bytes_pinned = eng.pinned.load();
    stats->io_mode = need_file ? st.mode : IoMode::kPread;
    stats->reader_threads = nreaders;
    stats->streams = static_cast<unsigned>(eng.streams.size());
    stats->chunks = st.chunks.size();
  }
  if (st.failed.load()) {
    arena.reset();  // frees the device memory now
    std::lock_guard<std::mutex> lock(st.err_mu);
    Error e = st.error ? std::move(*st.error) : Error(ErrorCode::kInternal, "load failed without an error");
    if (need_file && inputs.size() == 1) e.at_record(inputs[0].path.string());
    return unexpected(std::move(e));
  }
  return arena;
}

Result<DeviceArena> TransferEngine::load(const std::filesystem::path& file, std::span<const StorageSource> sources,
                                         LoadStats* stats) {
  return load_from(file, -1, sources, stats);
}

Result<DeviceArena> TransferEngine::load(const MappedFile& file, std::span<const StorageSource> sources,
                                         LoadStats* stats) {
  return load_from(file.path(), file.fd(), sources, stats);
}

Result<DeviceArena> load_storages(const std::filesystem::path& file, std::span<const StorageSource> sources,
                                  const TransferOptions& options, LoadStats* stats) {
  SAFECKPT_TRY(TransferEngine engine, TransferEngine::create(options));
  return engine.load(file, sources, stats);
}

}  // namespace safeckpt::cuda
