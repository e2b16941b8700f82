//! The binary first pass of vector search on large indexes.
//!
//! Every stored vector also has a 1-bit code (`chunk_codes`, 128 bytes at
//! 1024 dims). Search keeps them, with their chunk ids, in one contiguous file
//! beside the index (`<index>.codes`), memory-maps it and ranks every code by
//! Hamming distance to the query's: popcount over 64-bit words, both cores, and
//! an O(n) selection of the nearest (distances are small integers, so a
//! histogram finds the cut). Exact rescoring of those candidates is
//! `vector.rs`'s job.
//!
//! The file is derived data: deleting it loses nothing, and it is never read
//! against an index it does not match. Its header records the index's id, the
//! index's deletion epoch (bumped by the chunk delete trigger) and the largest
//! chunk id it holds. Before a scan, new chunks (ids above that) are appended;
//! any deletion since, a rebuild or another index file means a rewrite from
//! `chunk_codes` into a temporary file renamed over the old one, so a reader
//! that mapped the old file keeps a consistent view. The header also holds a
//! checksum of the records, checked whenever the file is opened: bytes
//! changed on disk mean a rewrite, never a scan over wrong codes.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use memmap2::{Mmap, MmapOptions};
use rayon::prelude::*;

use crate::index::store::{Store, code_bytes};

const MAGIC: &[u8; 8] = b"RCLCODE2";
const HEADER_BYTES: usize = 128;

/// What the file holds, and which state of which index it was made from.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Header {
    index_id: String,
    epoch: i64,
    dimension: u32,
    count: u64,
    max_id: i64,
    /// `Checksum` of the records.
    checksum: u64,
}

/// Where the header keeps the checksum.
const CHECKSUM_AT: usize = HEADER_BYTES - 8;

impl Header {
    fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut out = [0u8; HEADER_BYTES];
        out[..8].copy_from_slice(MAGIC);
        out[8..12].copy_from_slice(&self.dimension.to_le_bytes());
        out[12..20].copy_from_slice(&self.epoch.to_le_bytes());
        out[20..28].copy_from_slice(&self.count.to_le_bytes());
        out[28..36].copy_from_slice(&self.max_id.to_le_bytes());
        let id = self.index_id.as_bytes();
        // Index ids are 32 hex digits; a longer one cannot match and is cut.
        let n = id.len().min(CHECKSUM_AT - 37);
        out[36] = n as u8;
        out[37..37 + n].copy_from_slice(&id[..n]);
        out[CHECKSUM_AT..].copy_from_slice(&self.checksum.to_le_bytes());
        out
    }

    fn decode(b: &[u8; HEADER_BYTES]) -> Option<Self> {
        if &b[..8] != MAGIC {
            return None;
        }
        let word = |at: usize| -> [u8; 8] { b[at..at + 8].try_into().unwrap() };
        let n = b[36] as usize;
        Some(Self {
            dimension: u32::from_le_bytes(b[8..12].try_into().unwrap()),
            epoch: i64::from_le_bytes(word(12)),
            count: u64::from_le_bytes(word(20)),
            max_id: i64::from_le_bytes(word(28)),
            index_id: String::from_utf8(b.get(37..(37 + n).min(CHECKSUM_AT))?.to_vec()).ok()?,
            checksum: u64::from_le_bytes(word(CHECKSUM_AT)),
        })
    }
}

/// The state of the index that the file must match, read in one snapshot.
struct IndexState {
    index_id: String,
    epoch: i64,
    dimension: u32,
    max_id: i64,
}

/// A mapped, up-to-date code file.
pub struct CodeFile {
    map: Option<Mmap>,
    count: usize,
    record: usize,
}

/// Where the code file of the index at `index` lives.
pub fn path_for(index: &Path) -> PathBuf {
    let mut p = index.as_os_str().to_owned();
    p.push(".codes");
    PathBuf::from(p)
}

/// The number of vectors in the index, cheaply (ids are dense unless many
/// chunks were deleted, so this errs on the large side).
pub fn approximate_len(store: &Store) -> Result<i64> {
    store.last_code_id()
}

impl CodeFile {
    /// Brings the code file of `store` in step with it and maps it.
    pub fn open(store: &Store) -> Result<Self> {
        let path = path_for(store.path());
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(lock_path(&path))
            .with_context(|| format!("cannot create {}", lock_path(&path).display()))?;
        // Appends and rewrites are serialised across processes; readers that
        // already mapped the file only ever look below their own count.
        lock.lock()
            .with_context(|| format!("cannot lock {}", lock_path(&path).display()))?;
        // A read snapshot, not the write lock that the index's transactions take.
        let tx = store.read_snapshot()?;
        let state = IndexState::read(store)?;
        let record = 8 + code_bytes(state.dimension as usize);
        let header = read_header(&path);
        let header = match header {
            Some((h, len))
                if h.index_id == state.index_id
                    && h.epoch == state.epoch
                    && h.dimension == state.dimension
                    && len >= HEADER_BYTES as u64 + h.count * record as u64 =>
            {
                if !records_intact(&path, &h, record)? {
                    tracing::warn!(
                        "{}: its records do not match their checksum (changed on disk): rewriting it from the index",
                        path.display()
                    );
                    rewrite(store, &path, &state, record)?
                } else if h.max_id < state.max_id {
                    append(store, &path, h, record)?
                } else {
                    h
                }
            }
            _ => rewrite(store, &path, &state, record)?,
        };
        drop(tx);
        let count = header.count as usize;
        let map = if count == 0 {
            None
        } else {
            let file = File::open(&path)?;
            // SAFETY: the mapped prefix (header and `count` records) is never
            // written again: appends go past it and rewrites go to a new file
            // that is renamed over this one.
            Some(unsafe {
                MmapOptions::new()
                    .len(HEADER_BYTES + count * record)
                    .map(&file)
                    .with_context(|| format!("cannot map {}", path.display()))?
            })
        };
        Ok(Self { map, count, record })
    }

    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Candidate chunk ids for the vectors nearest to `query`, best first: the
    /// `scan` codes nearest in Hamming distance to the query's code, re-ranked
    /// by the query's dot product with each code's ±1 vector (asymmetric: the
    /// query keeps its floats, which ranks far better than Hamming alone), of
    /// which the best `keep` are returned.
    pub fn candidates(&self, query: &[f32], scan: usize, keep: usize) -> Vec<i64> {
        let Some(map) = &self.map else {
            return Vec::new();
        };
        let records = &map[HEADER_BYTES..HEADER_BYTES + self.count * self.record];
        let code = crate::index::store::binary_code(query);
        let words: Vec<u64> = code
            .chunks_exact(8)
            .map(|w| u64::from_le_bytes(w.try_into().unwrap()))
            .collect();
        let mut distances = vec![0u16; self.count];
        let per_task = self
            .count
            .div_ceil(rayon::current_num_threads().max(1))
            .max(4096);
        distances
            .par_chunks_mut(per_task)
            .zip(records.par_chunks(per_task * self.record))
            .for_each(|(out, recs)| hamming(recs, self.record, &words, out));
        let table = SignedSums::new(query);
        let mut ranked: Vec<(f32, usize)> = select_smallest(&distances, scan)
            .into_iter()
            .map(|i| {
                let at = i * self.record;
                (table.dot(&records[at + 8..at + self.record]), at)
            })
            .collect();
        ranked.sort_by(|a, b| b.0.total_cmp(&a.0));
        ranked
            .into_iter()
            .take(keep)
            .map(|(_, at)| i64::from_le_bytes(records[at..at + 8].try_into().unwrap()))
            .collect()
    }
}

impl IndexState {
    fn read(store: &Store) -> Result<Self> {
        let identity = store
            .identity()?
            .context("the index is empty: run `recall index` first")?;
        Ok(Self {
            index_id: store.index_id()?,
            epoch: store.codes_epoch()?,
            dimension: identity.dimension as u32,
            max_id: approximate_len(store)?,
        })
    }
}

fn lock_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".lock");
    PathBuf::from(p)
}

fn read_header(path: &Path) -> Option<(Header, u64)> {
    let mut file = File::open(path).ok()?;
    let mut buf = [0u8; HEADER_BYTES];
    file.read_exact(&mut buf).ok()?;
    Some((Header::decode(&buf)?, file.metadata().ok()?.len()))
}

/// A checksum of records, folded in order: appending continues it from
/// the previous value. Every 64-bit word is mixed in, so any changed byte
/// changes it (almost surely); fast enough to run at every open (a
/// multiply per word).
#[derive(Clone, Copy)]
struct Checksum(u64);

impl Checksum {
    const START: u64 = 0x243f_6a88_85a3_08d3;

    fn update(&mut self, bytes: &[u8]) {
        let mut h = self.0;
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            h = (h ^ u64::from_le_bytes(w.try_into().unwrap()))
                .wrapping_mul(0x9e37_79b9_7f4a_7c15)
                .rotate_left(31);
        }
        for b in words.remainder() {
            h = (h ^ *b as u64)
                .wrapping_mul(0x9e37_79b9_7f4a_7c15)
                .rotate_left(31);
        }
        self.0 = h;
    }
}

/// Whether the records of the file at `path` still have `header`'s checksum.
/// Checked once per process for each state of the file (its length, time
/// and checksum): a server searching over and over reads it once.
fn records_intact(path: &Path, header: &Header, record: usize) -> Result<bool> {
    use std::collections::HashMap;
    use std::sync::Mutex;
    type Seen = (u64, Option<std::time::SystemTime>, u64);
    static CHECKED: Mutex<Option<HashMap<PathBuf, Seen>>> = Mutex::new(None);
    let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let meta = file.metadata()?;
    let seen: Seen = (meta.len(), meta.modified().ok(), header.checksum);
    if CHECKED
        .lock()
        .unwrap()
        .as_ref()
        .is_some_and(|c| c.get(path) == Some(&seen))
    {
        return Ok(true);
    }
    let intact = checksum_matches(&file, path, header, record)?;
    if intact {
        CHECKED
            .lock()
            .unwrap()
            .get_or_insert_default()
            .insert(path.to_path_buf(), seen);
    }
    Ok(intact)
}

fn checksum_matches(file: &File, path: &Path, header: &Header, record: usize) -> Result<bool> {
    if header.count == 0 {
        return Ok(header.checksum == Checksum::START);
    }
    let len = HEADER_BYTES + header.count as usize * record;
    // SAFETY: read only; the records below `count` are never written again
    // (see `open`), and a concurrent writer holds the lock we hold.
    let map = unsafe { MmapOptions::new().len(len).map(file) }
        .with_context(|| format!("cannot map {}", path.display()))?;
    let mut sum = Checksum(Checksum::START);
    sum.update(&map[HEADER_BYTES..]);
    Ok(sum.0 == header.checksum)
}

/// Writes the codes of chunks above `after` to `out`, folding them into
/// `sum`; returns how many and the last id.
fn write_codes(
    store: &Store,
    after: i64,
    record: usize,
    sum: &mut Checksum,
    out: &mut impl Write,
) -> Result<(u64, i64)> {
    let (mut count, mut last) = (0u64, after);
    store.codes_after(after, |id, code| {
        if code.len() + 8 != record {
            bail!(
                "chunk {id} has a {}-byte code where {} bytes were expected: run `recall index --rebuild`",
                code.len(),
                record - 8
            );
        }
        out.write_all(&id.to_le_bytes())?;
        out.write_all(code)?;
        sum.update(&id.to_le_bytes());
        sum.update(code);
        count += 1;
        last = id;
        Ok(())
    })?;
    Ok((count, last))
}

fn rewrite(store: &Store, path: &Path, state: &IndexState, record: usize) -> Result<Header> {
    let tmp = path.with_extension(format!("codes.tmp{}", std::process::id()));
    let result = (|| -> Result<Header> {
        let mut out = BufWriter::new(File::create(&tmp)?);
        out.write_all(&[0u8; HEADER_BYTES])?;
        let mut sum = Checksum(Checksum::START);
        let (count, max_id) = write_codes(store, i64::MIN, record, &mut sum, &mut out)?;
        let header = Header {
            index_id: state.index_id.clone(),
            epoch: state.epoch,
            dimension: state.dimension,
            count,
            max_id,
            checksum: sum.0,
        };
        out.seek(SeekFrom::Start(0))?;
        out.write_all(&header.encode())?;
        out.into_inner()?.sync_all()?;
        std::fs::rename(&tmp, path)?;
        Ok(header)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.with_context(|| format!("cannot write {}", path.display()))
}

fn append(store: &Store, path: &Path, mut header: Header, record: usize) -> Result<Header> {
    let result = (|| -> Result<Header> {
        let mut file = OpenOptions::new().read(true).write(true).open(path)?;
        // Whatever a crashed append left past the last counted record goes.
        let end = HEADER_BYTES as u64 + header.count * record as u64;
        file.set_len(end)?;
        file.seek(SeekFrom::Start(end))?;
        let mut out = BufWriter::new(&mut file);
        let mut sum = Checksum(header.checksum);
        let (added, last) = write_codes(store, header.max_id, record, &mut sum, &mut out)?;
        out.flush()?;
        drop(out);
        header.count += added;
        header.max_id = last;
        header.checksum = sum.0;
        // The header goes last: a crash before this line leaves the old count.
        file.seek(SeekFrom::Start(0))?;
        file.write_all(&header.encode())?;
        Ok(header)
    })();
    result.with_context(|| format!("cannot update {}", path.display()))
}

#[inline(always)]
fn hamming_portable(records: &[u8], record: usize, query: &[u64], out: &mut [u16]) {
    for (r, d) in records.chunks_exact(record).zip(out.iter_mut()) {
        let mut bits = 0u32;
        for (w, q) in r[8..].chunks_exact(8).zip(query) {
            bits += (u64::from_le_bytes(w.try_into().unwrap()) ^ q).count_ones();
        }
        *d = bits as u16;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "popcnt")]
fn hamming_popcnt(records: &[u8], record: usize, query: &[u64], out: &mut [u16]) {
    // The same loop, compiled with the popcnt instruction (the x86-64 baseline
    // lacks it, and a software count is several times slower).
    hamming_portable(records, record, query, out)
}

fn hamming(records: &[u8], record: usize, query: &[u64], out: &mut [u16]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("popcnt") {
        // SAFETY: the CPU has popcnt (checked just above).
        return unsafe { hamming_popcnt(records, record, query, out) };
    }
    hamming_portable(records, record, query, out)
}

/// The dot product of a float query with ±1 codes, by table: for each code
/// byte, the sum of the query's components whose bits are set, for all 256
/// byte values. dot(q, ±1) = 2·Σ(set) − Σ(all).
struct SignedSums {
    table: Vec<f32>,
    total: f32,
}

impl SignedSums {
    fn new(query: &[f32]) -> Self {
        let bytes = query.len().div_ceil(8);
        let mut table = vec![0f32; bytes * 256];
        for b in 0..bytes {
            let part = &query[b * 8..(b * 8 + 8).min(query.len())];
            let row = &mut table[b * 256..(b + 1) * 256];
            for value in 1..256usize {
                // Built from the value without its lowest set bit.
                let low = value.trailing_zeros() as usize;
                row[value] = row[value & (value - 1)] + part.get(low).copied().unwrap_or(0.0);
            }
        }
        Self {
            table,
            total: query.iter().sum(),
        }
    }

    fn dot(&self, code: &[u8]) -> f32 {
        let set: f32 = code
            .iter()
            .zip(self.table.chunks_exact(256))
            .map(|(&byte, row)| row[byte as usize])
            .sum();
        2.0 * set - self.total
    }
}

/// Positions of the `n` smallest distances, smallest first (ties by position).
fn select_smallest(distances: &[u16], n: usize) -> Vec<usize> {
    let n = n.min(distances.len());
    if n == 0 {
        return Vec::new();
    }
    let mut histogram = vec![0usize; u16::MAX as usize + 1];
    let top = distances.iter().copied().max().unwrap_or(0) as usize;
    for &d in distances {
        histogram[d as usize] += 1;
    }
    // The cut: every distance below it is taken, and some at it.
    let (mut cut, mut below) = (0usize, 0usize);
    while cut <= top && below + histogram[cut] < n {
        below += histogram[cut];
        cut += 1;
    }
    let mut at_cut = n - below;
    let mut picked: Vec<usize> = Vec::with_capacity(n);
    for (i, &d) in distances.iter().enumerate() {
        if (d as usize) < cut {
            picked.push(i);
        } else if d as usize == cut && at_cut > 0 {
            picked.push(i);
            at_cut -= 1;
        }
    }
    picked.sort_by_key(|&i| (distances[i], i));
    picked
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip() {
        let h = Header {
            index_id: "0123456789abcdef0123456789abcdef".into(),
            epoch: 7,
            dimension: 1024,
            count: 12,
            max_id: 99,
            checksum: 0xdead_beef_0123_4567,
        };
        assert_eq!(Header::decode(&h.encode()), Some(h));
        assert_eq!(Header::decode(&[0u8; HEADER_BYTES]), None);
    }

    #[test]
    fn selection_matches_a_full_sort() {
        let distances: Vec<u16> = (0..5000u32).map(|i| ((i * 7919) % 1025) as u16).collect();
        for n in [0, 1, 10, 999, 5000, 6000] {
            let mut want: Vec<usize> = (0..distances.len()).collect();
            want.sort_by_key(|&i| (distances[i], i));
            want.truncate(n);
            assert_eq!(select_smallest(&distances, n), want, "n = {n}");
        }
    }

    #[test]
    fn signed_sums_are_dot_products_with_the_signs() {
        let query: Vec<f32> = (0..20).map(|i| (i as f32 * 0.37).sin()).collect();
        let stored: Vec<f32> = (0..20).map(|i| (i as f32 * 1.9).cos()).collect();
        let code = crate::index::store::binary_code(&stored);
        let want: f32 = query
            .iter()
            .zip(&stored)
            .map(|(q, s)| if *s > 0.0 { *q } else { -*q })
            .sum();
        assert!((SignedSums::new(&query).dot(&code) - want).abs() < 1e-5);
    }

    #[test]
    fn popcount_paths_agree() {
        let record = 8 + 16;
        let records: Vec<u8> = (0..record * 50).map(|i| (i * 37 % 251) as u8).collect();
        let query = [0x0123_4567_89ab_cdefu64, 0xfedc_ba98_7654_3210];
        let (mut a, mut b) = (vec![0u16; 50], vec![0u16; 50]);
        hamming_portable(&records, record, &query, &mut a);
        hamming(&records, record, &query, &mut b);
        assert_eq!(a, b);
        assert!(a.iter().any(|&d| d > 0));
    }
}
