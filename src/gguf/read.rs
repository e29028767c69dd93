//! Strict GGUF parser: every count, length and offset is checked against the
//! bytes actually present before it is used.

use std::collections::HashSet;
use std::fs::File;
use std::path::{Path, PathBuf};

use super::types::GgmlType;
use super::value::{Value, ValueType};
use super::{GgufError, MAGIC};

/// Deepest array nesting accepted; real files nest at most once.
const MAX_ARRAY_DEPTH: u32 = 8;
/// ggml's `GGML_MAX_DIMS`.
const MAX_DIMS: u32 = 4;
/// Alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// One tensor's entry in the file's tensor table.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// Tensor name, e.g. `blk.0.ffn_up_exps.weight`.
    pub name: String,
    /// ggml dimensions, fastest-varying first (`ne[0]`, `ne[1]`...).
    pub dims: Vec<u64>,
    /// Element type.
    pub ty: GgmlType,
    /// Offset of the data relative to the start of the data section.
    pub offset: u64,
    /// Size of the data in bytes.
    pub size: u64,
}

impl TensorInfo {
    /// Number of elements.
    pub fn elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// A parsed GGUF file: header, metadata and tensor table. Tensor data is not
/// read; use the offsets.
#[derive(Debug, Clone)]
pub struct GgufFile {
    /// Format version (2 or 3).
    pub version: u32,
    /// Data alignment (`general.alignment`, default 32).
    pub alignment: u64,
    /// Absolute byte offset of the data section.
    pub data_offset: u64,
    /// Size of the whole file in bytes.
    pub file_size: u64,
    metadata: Vec<(String, Value)>,
    tensors: Vec<TensorInfo>,
}

impl GgufFile {
    /// Opens and parses a file. The header is read into memory (a first
    /// part, more while the parse needs it), not mapped: a file cut short
    /// while it is read gives an error, not SIGBUS.
    pub fn open(path: &Path) -> Result<GgufFile> {
        let io_err = |source| GgufError::Io { path: path.to_path_buf(), source };
        let file = File::open(path).map_err(io_err)?;
        let len = file.metadata().map_err(io_err)?.len();
        GgufFile::read_header(path, len, FIRST_READ, u64::MAX, |buf, want| fill_from(&file, buf, want))
    }

    /// Parses the header of a file of `len` bytes named `name` whose bytes
    /// come from `more(buf, want)`, which appends the next bytes to `buf`
    /// until it holds `want` (fewer where the file ends):
    /// `first` bytes at first, four times as many while the parse needs
    /// more, up to `max` (a header past it is an error). A file on the hub
    /// is read this way by range requests.
    pub fn read_header(
        name: &Path,
        len: u64,
        first: u64,
        max: u64,
        mut more: impl FnMut(&mut Vec<u8>, u64) -> std::io::Result<()>,
    ) -> Result<GgufFile> {
        let io_err = |source| GgufError::Io { path: name.to_path_buf(), source };
        if len == 0 {
            return Err(GgufError::invalid(0, "magic", "file is empty").in_file(name));
        }
        let mut want = len.min(first.max(1)).min(max);
        let mut buf = Vec::new();
        loop {
            more(&mut buf, want).map_err(io_err)?;
            let got = buf.len() as u64;
            // A file that shrank since its size was read is parsed as it is now.
            let size = if got < want { got } else { len };
            let mut parser = Parser { buf: &buf, pos: 0, file_size: size, short: false };
            match parser.file() {
                Err(_) if parser.short && want < size && want >= max => {
                    return Err(GgufError::invalid(
                        want,
                        "header",
                        format!(
                            "the header goes on past {} (a string or array in it claims more than a model's header \
                             holds): not read further",
                            crate::units::size(max)
                        ),
                    )
                    .in_file(name));
                }
                Err(_) if parser.short && want < size => want = want.saturating_mul(4).min(size).min(max),
                done => return done.map_err(|e| e.in_file(name)),
            }
        }
    }

    /// Parses a complete GGUF image held in memory.
    pub fn parse(bytes: &[u8]) -> Result<GgufFile> {
        Parser { buf: bytes, pos: 0, file_size: bytes.len() as u64, short: false }.file()
    }

    /// All metadata in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    /// The value stored under `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// A string value.
    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(Value::as_str)
    }

    /// An integer value of any integer type.
    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key).and_then(Value::as_u64)
    }

    /// `general.architecture`.
    pub fn architecture(&self) -> Option<&str> {
        self.get_str("general.architecture")
    }

    /// `<arch>.<suffix>` as an integer.
    pub fn arch_u64(&self, suffix: &str) -> Option<u64> {
        self.get_u64(&format!("{}.{suffix}", self.architecture()?))
    }

    /// The tensor table in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }
}

/// How much of a file [`GgufFile::open`] reads first: most headers fit.
const FIRST_READ: u64 = 4 << 20;

/// Appends `file`'s next bytes to `buf` (from offset `buf.len()`) until
/// it holds `want` bytes or the file ends.
fn fill_from(file: &File, buf: &mut Vec<u8>, want: u64) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let mut chunk = vec![0u8; (want as usize).saturating_sub(buf.len())];
    let (start, mut got) = (buf.len() as u64, 0);
    while got < chunk.len() {
        match file.read_at(&mut chunk[got..], start + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.extend_from_slice(&chunk[..got]);
    Ok(())
}

/// Path-free parse state over the first bytes of a file.
struct Parser<'a> {
    /// The bytes read (the whole file, or its first part).
    buf: &'a [u8],
    pos: usize,
    /// The whole file's size.
    file_size: u64,
    /// A read went past `buf` but not past the file: more must be read.
    short: bool,
}

type Result<T> = std::result::Result<T, GgufError>;

impl<'a> Parser<'a> {
    /// Bytes of the file after the parse position.
    fn remaining(&self) -> u64 {
        self.file_size - self.pos as u64
    }

    fn err(&self, field: &str, reason: impl Into<String>) -> GgufError {
        GgufError::invalid(self.pos as u64, field, reason)
    }

    fn take(&mut self, n: u64, field: &str) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(
                self.err(field, format!("needs {n} bytes but only {} remain before end of file", self.remaining()))
            );
        }
        let n = n as usize;
        if self.pos + n > self.buf.len() {
            self.short = true;
            return Err(self.err(field, "lies past the part of the file read"));
        }
        let out = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, field: &str) -> Result<[u8; N]> {
        Ok(self.take(N as u64, field)?.try_into().expect("take returned N bytes"))
    }

    fn u32(&mut self, field: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(field)?))
    }

    fn u64(&mut self, field: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(field)?))
    }

    /// A count of items each at least `min_item_len` bytes long, refused when
    /// the rest of the file could not possibly hold that many.
    fn count(&mut self, field: &str, min_item_len: u64) -> Result<u64> {
        let at = self.pos as u64;
        let n = self.u64(field)?;
        let fits = n.checked_mul(min_item_len).is_some_and(|need| need <= self.remaining());
        if !fits {
            return Err(GgufError::invalid(
                at,
                field,
                format!("count {n} cannot fit in the {} bytes that remain", self.remaining()),
            ));
        }
        Ok(n)
    }

    fn string(&mut self, field: &str) -> Result<String> {
        let at = self.pos as u64;
        let len = self.u64(field)?;
        let bytes = self.take(len, field)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| GgufError::invalid(at, field, "string is not valid UTF-8"))
    }

    fn value_type(&mut self, field: &str) -> Result<ValueType> {
        let at = self.pos as u64;
        let tag = self.u32(field)?;
        ValueType::from_tag(tag).ok_or_else(|| GgufError::invalid(at, field, format!("unknown value type {tag}")))
    }

    fn value(&mut self, ty: ValueType, field: &str, depth: u32) -> Result<Value> {
        Ok(match ty {
            ValueType::U8 => Value::U8(self.array::<1>(field)?[0]),
            ValueType::I8 => Value::I8(i8::from_le_bytes(self.array(field)?)),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(field)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(field)?)),
            ValueType::U32 => Value::U32(self.u32(field)?),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array(field)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(field)?)),
            ValueType::U64 => Value::U64(self.u64(field)?),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array(field)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(field)?)),
            ValueType::Bool => {
                let at = self.pos as u64;
                match self.array::<1>(field)?[0] {
                    0 => Value::Bool(false),
                    1 => Value::Bool(true),
                    b => return Err(GgufError::invalid(at, field, format!("bool byte {b} is not 0 or 1"))),
                }
            }
            ValueType::String => Value::String(self.string(field)?),
            ValueType::Array => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(self.err(field, format!("arrays nested deeper than {MAX_ARRAY_DEPTH}")));
                }
                let elem = self.value_type(field)?;
                let min_len = elem.min_encoded_len();
                let n = self.count(field, min_len)?;
                // `count` bounded n by the file; the room reserved is bounded
                // by the bytes read so far too (a header read in windows
                // does not reserve for a count the window cannot hold).
                let in_buf = (self.buf.len().saturating_sub(self.pos) as u64) / min_len.max(1);
                let mut items = Vec::with_capacity(n.min(in_buf) as usize);
                for _ in 0..n {
                    items.push(self.value(elem, field, depth + 1)?);
                }
                Value::Array(elem, items)
            }
        })
    }

    fn file(&mut self) -> Result<GgufFile> {
        let magic = self.array::<4>("magic")?;
        if magic != MAGIC {
            return Err(GgufError::invalid(0, "magic", format!("expected \"GGUF\", found {}", shown_bytes(&magic))));
        }
        let version = self.u32("version")?;
        if !(2..=3).contains(&version) {
            return Err(GgufError::invalid(4, "version", format!("version {version} is not supported (2 or 3)")));
        }
        // Smallest tensor info: name length, n_dims, type, offset.
        let n_tensors = self.count("tensor_count", 8 + 4 + 4 + 8)?;
        // Smallest key/value: key length, type tag, one byte of value.
        let n_kv = self.count("kv_count", 8 + 4 + 1)?;

        let mut metadata = Vec::with_capacity(n_kv as usize);
        let mut keys = HashSet::new();
        for i in 0..n_kv {
            let key_at = self.pos as u64;
            let key = self.string(&format!("key of metadata entry {i}"))?;
            if !keys.insert(key.clone()) {
                return Err(GgufError::invalid(key_at, &key, "duplicate metadata key"));
            }
            let ty = self.value_type(&key)?;
            let value = self.value(ty, &key, 0)?;
            metadata.push((key, value));
        }

        let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some((_, Value::U32(a))) if a.is_power_of_two() => u64::from(*a),
            Some((_, v)) => {
                return Err(GgufError::invalid(0, "general.alignment", format!("{v} is not a power-of-two u32")));
            }
        };

        let mut tensors = Vec::with_capacity(n_tensors as usize);
        let mut names = HashSet::new();
        for i in 0..n_tensors {
            let info_at = self.pos as u64;
            let name = self.string(&format!("name of tensor {i}"))?;
            if !names.insert(name.clone()) {
                return Err(GgufError::invalid(info_at, &name, "duplicate tensor name"));
            }
            tensors.push(self.tensor_info(name)?);
        }

        let data_offset = (self.pos as u64).next_multiple_of(alignment);
        let file_size = self.file_size;
        if data_offset > file_size && !tensors.is_empty() {
            return Err(GgufError::invalid(data_offset, "data section", "starts past end of file"));
        }
        for t in &tensors {
            if t.offset % alignment != 0 {
                return Err(GgufError::invalid(
                    data_offset.saturating_add(t.offset),
                    &t.name,
                    format!("data offset {} is not a multiple of the alignment {alignment}", t.offset),
                ));
            }
            let end = data_offset.checked_add(t.offset).and_then(|s| s.checked_add(t.size));
            if end.is_none_or(|end| end > file_size) {
                return Err(GgufError::invalid(
                    data_offset.saturating_add(t.offset),
                    &t.name,
                    format!("{} bytes of data at offset {} run past end of file ({file_size} bytes)", t.size, t.offset),
                ));
            }
        }
        Ok(GgufFile { version, alignment, data_offset, file_size, metadata, tensors })
    }

    fn tensor_info(&mut self, name: String) -> Result<TensorInfo> {
        let dims_at = self.pos as u64;
        let n_dims = self.u32(&name)?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(GgufError::invalid(dims_at, &name, format!("{n_dims} dimensions (1 to {MAX_DIMS} allowed)")));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(self.u64(&name)?);
        }
        let type_at = self.pos as u64;
        let tag = self.u32(&name)?;
        let ty = GgmlType::from_id(tag)
            .ok_or_else(|| GgufError::invalid(type_at, &name, format!("unknown ggml type {tag}")))?;
        let offset = self.u64(&name)?;
        let rows = dims[1..].iter().try_fold(1u64, |acc, &d| acc.checked_mul(d));
        let size = ty.row_bytes(dims[0]).zip(rows).and_then(|(row, rows)| row.checked_mul(rows)).ok_or_else(|| {
            GgufError::invalid(
                dims_at,
                &name,
                format!("shape {dims:?} is not a whole number of {ty} blocks or overflows"),
            )
        })?;
        Ok(TensorInfo { name, dims, ty, offset, size })
    }
}

/// Builds `<prefix>-<no>-of-<count>.gguf` with llama.cpp's 5-digit numbering.
pub fn split_path(prefix: &Path, no: u32, count: u32) -> PathBuf {
    let mut s = prefix.as_os_str().to_os_string();
    s.push(format!("-{no:05}-of-{count:05}.gguf"));
    PathBuf::from(s)
}

/// Splits `<prefix>-NNNNN-of-MMMMM.gguf` into (prefix, NNNNN, MMMMM).
pub fn parse_split_path(path: &Path) -> Option<(PathBuf, u32, u32)> {
    let s = path.to_str()?;
    let stem = s.strip_suffix(".gguf")?;
    let (rest, count) = stem.rsplit_once("-of-")?;
    let (prefix, no) = rest.rsplit_once('-')?;
    let digits = |d: &str| d.len() == 5 && d.bytes().all(|b| b.is_ascii_digit());
    if !digits(no) || !digits(count) {
        return None;
    }
    Some((PathBuf::from(prefix), no.parse().ok()?, count.parse().ok()?))
}

/// Bytes as a person reads them: the text where every byte is printable
/// ASCII, and the bytes in hex either way (`"{\"a\"" (7b 22 61 22)`).
fn shown_bytes(bytes: &[u8]) -> String {
    let hex: Vec<String> = bytes.iter().map(|b| format!("{b:02x}")).collect();
    if bytes.iter().all(|b| b.is_ascii_graphic() || *b == b' ') {
        format!("{:?} ({})", String::from_utf8_lossy(bytes), hex.join(" "))
    } else {
        format!("bytes {}", hex.join(" "))
    }
}

#[cfg(test)]
mod shown_bytes_tests {
    #[test]
    fn text_and_hex() {
        assert_eq!(super::shown_bytes(b"{\"a\""), r#""{\"a\"" (7b 22 61 22)"#);
        assert_eq!(super::shown_bytes(&[0, 1, 0x47, 0xff]), "bytes 00 01 47 ff");
    }
}
