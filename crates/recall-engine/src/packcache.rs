//! Packed weights kept on disk, so a start costs a map, not a packing.
//!
//! Packing a model's linear layers for recall's kernels (f32 panels, bf16
//! pairs, int8 with scales) writes a fresh copy of the weights into the
//! process's own memory: for BGE-M3 1.1 GB in f32, most of a start's half
//! second spent by the kernel zeroing pages, and memory no other process
//! can share. So the first load of a weights file in a dtype writes the
//! packed layers to `<cache>/packed/`, and later loads map that file
//! read-only: its pages are the page cache's, shared by every recall
//! process on the host and reclaimable under pressure.
//!
//! A pack file holds the layers in the order the encoder loads them, after
//! a header naming what they were packed from (the weights file's path,
//! size, time and a checksum of its safetensors header), for which dtype
//! and kernel, by which recall, and a checksum of the header itself. A
//! file whose header does not match, or whose size is not the header's,
//! is packed again. Files are only ever replaced by renaming a complete
//! new one into place, never written where a process may have them
//! mapped: a running process keeps reading the file it opened.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use memmap2::Mmap;
use sha2::{Digest, Sha256};

/// The first bytes of every pack file.
const MAGIC: &[u8; 8] = b"RCLPACK\0";
/// Bumped when a layer's packed layout changes.
const FORMAT: u32 = 1;
/// Where each layer starts in the file: enough for every element type and
/// a cache line.
const ALIGN: usize = 64;

/// Element types whose every bit pattern is a value, without padding, so a
/// packed layer can be read straight from a file's bytes.
///
/// # Safety
/// Implement only for such types.
pub unsafe trait Plain: Copy + Send + Sync + 'static {}
// SAFETY: a primitive number, 4 bytes without padding; every bit pattern is
// an f32 (NaNs included).
unsafe impl Plain for f32 {}
// SAFETY: a primitive integer, 1 byte; every bit pattern is an i8.
unsafe impl Plain for i8 {}
// SAFETY: a primitive integer, 4 bytes without padding; every bit pattern
// is an i32.
unsafe impl Plain for i32 {}
// SAFETY: `half::bf16` is `#[repr(transparent)]` over a u16: 2 bytes
// without padding, every bit pattern a value.
unsafe impl Plain for half::bf16 {}

/// A packed layer's elements: built in this process, or read from a pack
/// file's map (which lives as long as any of its slabs).
pub enum Slab<E> {
    Owned(Vec<E>),
    Mapped(MappedPart<E>),
}

/// `len` elements at byte `start` of a pack file's map. Only
/// `Reader::take` makes one, after checking that they lie inside the map,
/// aligned.
pub struct MappedPart<E> {
    map: Arc<Mmap>,
    start: usize,
    len: usize,
    element: PhantomData<E>,
}

impl<E: Plain> Slab<E> {
    /// The elements' bytes, to write to a pack file.
    pub fn bytes(&self) -> &[u8] {
        let elements: &[E] = self;
        // SAFETY: the same memory as `elements`, for as long; `Plain` types
        // have no padding, so every byte of it is initialised.
        unsafe {
            std::slice::from_raw_parts(elements.as_ptr().cast(), std::mem::size_of_val(elements))
        }
    }
}

impl<E> From<Vec<E>> for Slab<E> {
    fn from(v: Vec<E>) -> Self {
        Self::Owned(v)
    }
}

impl<E: Plain> std::ops::Deref for Slab<E> {
    type Target = [E];

    fn deref(&self) -> &[E] {
        match self {
            Self::Owned(v) => v,
            Self::Mapped(MappedPart {
                map, start, len, ..
            }) => {
                // SAFETY: `Reader::take`, the only maker of a MappedPart,
                // checked that `start` is aligned for E and that `len`
                // elements lie inside the map, which lives as long as
                // `self` (its Arc) and is read-only; every bit pattern is
                // an E (`Plain`).
                unsafe { std::slice::from_raw_parts(map.as_ptr().add(*start).cast(), *len) }
            }
        }
    }
}

/// A packed layer's parts, in the order it writes and reads them.
pub trait Packed {
    /// The parts' bytes.
    fn parts(&self) -> Vec<&[u8]>;
}

/// Collects the parts of every layer of a model, in load order.
#[derive(Default)]
pub struct Writer<'a> {
    parts: Vec<&'a [u8]>,
}

impl<'a> Writer<'a> {
    pub fn push(&mut self, layer: &'a impl Packed) {
        self.parts.extend(layer.parts());
    }
}

/// The parts of a pack file, handed out in the order they were written.
pub struct Reader {
    map: Arc<Mmap>,
    /// (start, length in bytes) of each part.
    parts: Vec<(usize, usize)>,
    next: usize,
}

impl Reader {
    /// The next part, as `len` elements of E.
    pub fn take<E: Plain>(&mut self, len: usize) -> Result<Slab<E>> {
        let Some(&(start, bytes)) = self.parts.get(self.next) else {
            bail!("the pack file holds fewer layers than the model has");
        };
        self.next += 1;
        let needed = len.checked_mul(std::mem::size_of::<E>());
        if needed != Some(bytes) {
            bail!(
                "part {} of the pack file has {bytes} bytes, the model needs {len} elements of {}",
                self.next - 1,
                std::mem::size_of::<E>()
            );
        }
        // `open` checked that the part lies inside the map and starts at a
        // multiple of ALIGN; the map is page-aligned.
        if start
            .checked_add(bytes)
            .is_none_or(|end| end > self.map.len())
            || !(self.map.as_ptr() as usize + start).is_multiple_of(std::mem::align_of::<E>())
        {
            bail!("part {} of the pack file lies outside it", self.next - 1);
        }
        Ok(Slab::Mapped(MappedPart {
            map: self.map.clone(),
            start,
            len,
            element: PhantomData,
        }))
    }

    /// Fails unless every part was taken.
    pub fn finish(&self) -> Result<()> {
        if self.next != self.parts.len() {
            bail!(
                "the pack file holds {} parts, the model took {}",
                self.parts.len(),
                self.next
            );
        }
        Ok(())
    }
}

/// What a pack file is of: compared at load.
#[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug, Clone)]
struct Identity {
    format: u32,
    recall: String,
    /// The weights file, as it was found.
    source_path: PathBuf,
    /// The weights file's path, size and time (`model::file_key`).
    source: String,
    /// SHA-256 of the weights file's safetensors header.
    source_header: String,
    dtype: String,
    kernel: String,
}

/// A pack file's header: what it is of, and where its parts lie.
#[derive(serde::Serialize, serde::Deserialize, Debug)]
struct Header {
    identity: Identity,
    /// (start, length in bytes) of each part.
    parts: Vec<(usize, usize)>,
    /// The file's length.
    size: usize,
}

/// The pack file of one weights file, dtype and kernel.
pub struct PackFile {
    path: PathBuf,
    identity: Identity,
}

impl PackFile {
    /// The pack file for `weights` (a safetensors file whose header is
    /// `source_header`) in `dtype` on `kernel`, under `cache_dir`.
    pub fn new(
        cache_dir: &Path,
        weights: &Path,
        source_header: &[u8],
        dtype: &str,
        kernel: &str,
    ) -> Result<Self> {
        let canonical = weights
            .canonicalize()
            .unwrap_or_else(|_| weights.to_path_buf());
        // Named by what it is for, not by its contents: a new version of
        // the weights replaces the old pack file instead of adding one.
        let name = hex(&Sha256::digest(
            format!("{}\0{dtype}\0{kernel}", canonical.display()).as_bytes(),
        ))[..24]
            .to_string();
        Ok(Self {
            path: cache_dir.join("packed").join(format!("{name}.pack")),
            identity: Identity {
                format: FORMAT,
                recall: env!("CARGO_PKG_VERSION").to_string(),
                source_path: canonical,
                source: crate::model::file_key(weights)?,
                source_header: hex(&Sha256::digest(source_header)),
                dtype: dtype.to_string(),
                kernel: kernel.to_string(),
            },
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's parts, if it exists and is what it should be. `Ok(None)`:
    /// there is none; an error: there is one, stale or damaged (say why).
    pub fn open(&self) -> Result<Option<Reader>> {
        let file = match File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).context("cannot open it"),
        };
        // SAFETY: read-only; pack files are replaced by rename, never
        // rewritten in place (see the module's comment).
        let map = unsafe { Mmap::map(&file) }.context("cannot map it")?;
        let header = read_header(&map)?;
        if header.identity != self.identity {
            bail!("it was packed from other weights, for another kernel or by another recall");
        }
        if header.size != map.len() {
            bail!(
                "it has {} bytes, its header says {} (cut short?)",
                map.len(),
                header.size
            );
        }
        for &(start, len) in &header.parts {
            if start % ALIGN != 0 || start.checked_add(len).is_none_or(|end| end > map.len()) {
                bail!("a part lies outside the file");
            }
        }
        Ok(Some(Reader {
            map: Arc::new(map),
            parts: header.parts,
            next: 0,
        }))
    }

    /// Writes `parts` as this pack file: into a temporary file beside it,
    /// renamed into place when complete. Refuses when the disk would be
    /// left with less than a GiB free: a cache never takes the last of a
    /// disk that holds the user's history.
    pub fn write(&self, parts: &Writer) -> Result<()> {
        let dir = self.path.parent().context("a pack file has a directory")?;
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let mut header = Header {
            identity: self.identity.clone(),
            parts: Vec::new(),
            size: 0,
        };
        let mut at = 0;
        for part in &parts.parts {
            header.parts.push((at, part.len()));
            at = (at + part.len()).next_multiple_of(ALIGN);
        }
        // The header says where the parts start, which depends on the
        // header's length: move them on until it fits before them.
        let relative = header.parts.clone();
        let mut data_start = 0;
        let encoded = loop {
            header.parts = relative.iter().map(|&(s, l)| (s + data_start, l)).collect();
            header.size = header.parts.last().map_or(data_start, |&(s, l)| s + l);
            let encoded = encode_header(&header)?;
            if encoded.len() <= data_start {
                break encoded;
            }
            data_start = encoded.len().next_multiple_of(ALIGN);
        };
        // Stale packs go first, and the file this one replaces counts as
        // free: a full disk must not keep them forever.
        prune(dir, &self.path);
        const MARGIN: u64 = 1 << 30;
        let replaced = std::fs::metadata(&self.path).map_or(0, |m| m.len());
        if let Some(free) = space_left(dir)
            && free + replaced < header.size as u64 + MARGIN
        {
            bail!(
                "{} has {} MiB free; packed weights take {} MiB and a GiB is kept free",
                dir.display(),
                free >> 20,
                header.size >> 20
            );
        }
        let tmp = tempfile::NamedTempFile::new_in(dir)
            .with_context(|| format!("cannot create a file in {}", dir.display()))?;
        let mut out = BufWriter::with_capacity(1 << 20, tmp.as_file());
        out.write_all(&encoded)?;
        let mut written = encoded.len();
        for (part, &(start, _)) in parts.parts.iter().zip(&header.parts) {
            out.write_all(&vec![0u8; start - written])?;
            out.write_all(part)?;
            written = start + part.len();
        }
        out.flush()?;
        drop(out);
        // On disk before it is renamed into place: after a power cut, a
        // file of the right name and size with data blocks never written
        // would pass every check of `open`.
        tmp.as_file()
            .sync_all()
            .with_context(|| format!("cannot write {}", tmp.path().display()))?;
        tmp.persist(&self.path)
            .with_context(|| format!("cannot write {}", self.path.display()))?;
        Ok(())
    }
}

/// Removes the pack files in `dir` (but `keep`) whose weights file is gone
/// or has changed since, or whose header cannot be read: a model updated
/// or removed leaves no packed copy behind. A process that maps one keeps
/// reading it until it exits.
fn prune(dir: &Path, keep: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for path in entries.flatten().map(|e| e.path()) {
        if path == keep || path.extension().is_none_or(|e| e != "pack") {
            continue;
        }
        // A file that cannot be read (another user's, say) is left alone;
        // one that reads but is not a whole pack header is damaged.
        let stale = match File::open(&path) {
            Err(_) => false,
            Ok(file) => match header_bytes(file).and_then(|bytes| read_header(&bytes)) {
                Ok(h) => {
                    crate::model::file_key(&h.identity.source_path).ok() != Some(h.identity.source)
                }
                Err(_) => true,
            },
        };
        if stale {
            tracing::debug!("removing the stale {}", path.display());
            let _ = std::fs::remove_file(&path);
        }
    }
}

/// `MAGIC`, the JSON's length (u64 LE), the JSON's SHA-256, the JSON.
fn encode_header(header: &Header) -> Result<Vec<u8>> {
    let json = serde_json::to_vec(header)?;
    let mut out = Vec::with_capacity(48 + json.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(json.len() as u64).to_le_bytes());
    out.extend_from_slice(&Sha256::digest(&json));
    out.extend_from_slice(&json);
    Ok(out)
}

/// The first bytes of `file`, as many as its header takes (without reading
/// the layers).
fn header_bytes(mut file: File) -> Result<Vec<u8>> {
    use std::io::Read;
    let mut bytes = vec![0u8; 48];
    file.read_exact(&mut bytes)?;
    let len = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
    if len > 64 << 20 {
        bail!("its header is too long");
    }
    bytes.resize(48 + len as usize, 0);
    file.read_exact(&mut bytes[48..])?;
    Ok(bytes)
}

fn read_header(bytes: &[u8]) -> Result<Header> {
    if bytes.len() < 48 || &bytes[..8] != MAGIC {
        bail!("it is not a pack file");
    }
    let len = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
    let json = usize::try_from(len)
        .ok()
        .and_then(|len| bytes.get(48..48usize.checked_add(len)?))
        .context("its header is cut short")?;
    if Sha256::digest(json).as_slice() != &bytes[16..48] {
        bail!("its header is damaged");
    }
    serde_json::from_slice(json).context("its header is damaged")
}

/// Bytes an unprivileged process may still write in `dir`'s file system;
/// `None` where that cannot be asked.
fn space_left(dir: &Path) -> Option<u64> {
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
        let mut stat = std::mem::MaybeUninit::<libc::statvfs>::uninit();
        // SAFETY: a NUL-terminated path and a statvfs to fill.
        if unsafe { libc::statvfs(path.as_ptr(), stat.as_mut_ptr()) } != 0 {
            return None;
        }
        // SAFETY: statvfs succeeded, so it filled `stat`.
        let stat = unsafe { stat.assume_init() };
        #[allow(clippy::useless_conversion)] // u32 or u64 by platform
        Some(u64::from(stat.f_bavail) * u64::from(stat.f_frsize))
    }
    #[cfg(not(unix))]
    {
        let _ = dir;
        None
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Layer(Slab<f32>, Slab<i8>);

    impl Packed for Layer {
        fn parts(&self) -> Vec<&[u8]> {
            vec![self.0.bytes(), self.1.bytes()]
        }
    }

    fn pack_file(dir: &Path, weights: &Path) -> PackFile {
        PackFile::new(dir, weights, b"header", "f32", "Avx512").unwrap()
    }

    #[test]
    fn parts_round_trip_and_a_damaged_or_stale_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let weights = dir.path().join("model.safetensors");
        std::fs::write(&weights, b"weights").unwrap();
        let file = pack_file(dir.path(), &weights);
        assert!(file.open().unwrap().is_none());

        let layer = Layer(vec![1.5f32, -2.0, 3.25].into(), vec![-7i8; 100].into());
        let mut w = Writer::default();
        w.push(&layer);
        file.write(&w).unwrap();
        let mut r = file.open().unwrap().expect("written");
        let a: Slab<f32> = r.take(3).unwrap();
        assert_eq!(&*a, &[1.5, -2.0, 3.25]);
        assert!(r.finish().is_err(), "a part is left");
        assert!(r.take::<i8>(99).is_err(), "a part of the wrong size");
        let mut r = file.open().unwrap().unwrap();
        r.take::<f32>(3).unwrap();
        assert_eq!(&*r.take::<i8>(100).unwrap(), &[-7i8; 100][..]);
        r.finish().unwrap();
        assert!(r.take::<i8>(1).is_err(), "no part is left");

        // Another dtype, kernel or header has a file of its own or is stale.
        let other = PackFile::new(dir.path(), &weights, b"other", "f32", "Avx512").unwrap();
        assert_eq!(other.path(), file.path());
        assert!(other.open().is_err());
        let bf16 = PackFile::new(dir.path(), &weights, b"header", "bf16", "Avx512").unwrap();
        assert_ne!(bf16.path(), file.path());

        // Cut short, or a byte of the header changed.
        let bytes = std::fs::read(file.path()).unwrap();
        std::fs::write(file.path(), &bytes[..bytes.len() - 1]).unwrap();
        let err = file.open().err().expect("cut short");
        assert!(format!("{err:#}").contains("cut short"), "{err:#}");
        let mut damaged = bytes.clone();
        damaged[60] ^= 1;
        std::fs::write(file.path(), &damaged).unwrap();
        assert!(file.open().is_err());
        std::fs::write(file.path(), b"RCLPACK").unwrap();
        assert!(file.open().is_err());

        // The weights changed (size and time): stale.
        std::fs::write(file.path(), &bytes).unwrap();
        assert!(file.open().unwrap().is_some());
        std::fs::write(&weights, b"new weights").unwrap();
        let file = pack_file(dir.path(), &weights);
        assert!(file.open().is_err());
    }

    #[test]
    fn writing_removes_the_packs_of_weights_gone_or_changed() {
        let dir = tempfile::tempdir().unwrap();
        let layer = Layer(vec![1.0f32; 10].into(), vec![1i8].into());
        let mut w = Writer::default();
        w.push(&layer);
        let write = |name: &str| {
            let weights = dir.path().join(name);
            if !weights.exists() {
                std::fs::write(&weights, name).unwrap();
            }
            let file = pack_file(dir.path(), &weights);
            file.write(&w).unwrap();
            (weights, file.path().to_path_buf())
        };
        let (a, a_pack) = write("a.safetensors");
        let (b, b_pack) = write("b.safetensors");
        let (_, c_pack) = write("c.safetensors");
        let junk = dir.path().join("packed/junk.pack");
        std::fs::write(&junk, b"not a pack file").unwrap();
        let other = dir.path().join("packed/notes.txt");
        std::fs::write(&other, b"not ours").unwrap();
        std::fs::remove_file(&a).unwrap();
        std::fs::write(&b, "b, changed").unwrap();
        write("c.safetensors");
        assert!(!a_pack.exists(), "its weights are gone");
        assert!(!b_pack.exists(), "its weights changed");
        assert!(!junk.exists(), "unreadable");
        assert!(c_pack.exists() && other.exists());
    }

    #[test]
    fn every_length_of_header_is_written_and_read() {
        // The header's length moves the parts, whose places are in the
        // header: every path length must settle.
        let dir = tempfile::tempdir().unwrap();
        let layer = Layer(vec![0.5f32; 3].into(), vec![3i8; 5].into());
        let mut w = Writer::default();
        w.push(&layer);
        for n in 1..=130 {
            let weights = dir.path().join(format!("{}.safetensors", "w".repeat(n)));
            std::fs::write(&weights, b"weights").unwrap();
            let file = pack_file(dir.path(), &weights);
            file.write(&w).unwrap();
            let mut r = file.open().unwrap().unwrap();
            assert_eq!(&*r.take::<f32>(3).unwrap(), &[0.5; 3]);
            assert_eq!(&*r.take::<i8>(5).unwrap(), &[3; 5]);
            r.finish().unwrap();
        }
    }

    #[test]
    fn a_mapped_file_survives_its_replacement() {
        let dir = tempfile::tempdir().unwrap();
        let weights = dir.path().join("model.safetensors");
        std::fs::write(&weights, b"weights").unwrap();
        let file = pack_file(dir.path(), &weights);
        let old = Layer(vec![1.0f32; 1000].into(), vec![1i8].into());
        let mut w = Writer::default();
        w.push(&old);
        file.write(&w).unwrap();
        let mut r = file.open().unwrap().unwrap();
        let mapped: Slab<f32> = r.take(1000).unwrap();
        let new = Layer(vec![2.0f32; 1000].into(), vec![2i8].into());
        let mut w = Writer::default();
        w.push(&new);
        file.write(&w).unwrap();
        assert!(mapped.iter().all(|&v| v == 1.0));
        let mut r = file.open().unwrap().unwrap();
        assert!(r.take::<f32>(1000).unwrap().iter().all(|&v| v == 2.0));
    }
}
