//! Streaming GGUF v3 writer: the layout is fixed up front, then tensor data is
//! written in order without holding the whole file in memory.

use std::io::{self, Write};

use super::MAGIC;
use super::read::DEFAULT_ALIGNMENT;
use super::types::GgmlType;
use super::value::Value;

/// A tensor to be written: name, ggml dims (fastest first) and type.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorSpec {
    /// Tensor name.
    pub name: String,
    /// ggml dimensions, `ne[0]` first.
    pub dims: Vec<u64>,
    /// Element type.
    pub ty: GgmlType,
}

impl TensorSpec {
    /// A new spec.
    pub fn new(name: impl Into<String>, dims: &[u64], ty: GgmlType) -> TensorSpec {
        TensorSpec { name: name.into(), dims: dims.to_vec(), ty }
    }

    /// Bytes of data. Panics if `dims[0]` is not a whole number of blocks,
    /// which is a bug in the caller building the model.
    pub fn size(&self) -> u64 {
        let row = self.ty.row_bytes(self.dims[0]).unwrap_or_else(|| {
            panic!("{}: {} elements is not a whole number of {} blocks", self.name, self.dims[0], self.ty)
        });
        row * self.dims[1..].iter().product::<u64>()
    }
}

/// Collects metadata and tensor specs, then writes the file.
#[derive(Debug, Clone, Default)]
pub struct GgufWriter {
    metadata: Vec<(String, Value)>,
    tensors: Vec<TensorSpec>,
}

impl GgufWriter {
    /// An empty writer.
    pub fn new() -> GgufWriter {
        GgufWriter::default()
    }

    /// Sets (or replaces) a metadata value.
    pub fn set(&mut self, key: &str, value: Value) {
        match self.metadata.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = value,
            None => self.metadata.push((key.to_string(), value)),
        }
    }

    /// Appends a tensor; data is written in the order tensors are added.
    pub fn add_tensor(&mut self, spec: TensorSpec) {
        self.tensors.push(spec);
    }

    /// The tensors in write order.
    pub fn tensors(&self) -> &[TensorSpec] {
        &self.tensors
    }

    fn alignment(&self) -> u64 {
        match self.metadata.iter().find(|(k, _)| k == "general.alignment") {
            Some((_, Value::U32(a))) => u64::from(*a),
            _ => DEFAULT_ALIGNMENT,
        }
    }

    /// Offsets of each tensor's data relative to the data section.
    pub fn data_offsets(&self) -> Vec<u64> {
        let align = self.alignment();
        let mut off = 0;
        self.tensors
            .iter()
            .map(|t| {
                let at = off;
                off = (off + t.size()).next_multiple_of(align);
                at
            })
            .collect()
    }

    /// Total bytes the file will have.
    pub fn file_size(&self) -> u64 {
        let header = self.header().len() as u64;
        let align = self.alignment();
        let data: u64 = self.tensors.iter().map(|t| t.size().next_multiple_of(align)).sum();
        header + data
    }

    /// Header, metadata and tensor table, padded to the alignment.
    pub fn header(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            put_str(&mut out, k);
            out.extend_from_slice(&v.value_type().tag().to_le_bytes());
            put_value(&mut out, v);
        }
        for (t, off) in self.tensors.iter().zip(self.data_offsets()) {
            put_str(&mut out, &t.name);
            out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.ty.id().to_le_bytes());
            out.extend_from_slice(&off.to_le_bytes());
        }
        out.resize((out.len() as u64).next_multiple_of(self.alignment()) as usize, 0);
        out
    }

    /// Writes the whole file. `data(i)` must return exactly the bytes of
    /// tensor `i`; tensors are requested in order.
    pub fn write(&self, out: &mut dyn Write, data: &mut dyn FnMut(usize) -> io::Result<Vec<u8>>) -> io::Result<()> {
        out.write_all(&self.header())?;
        let align = self.alignment();
        for (i, t) in self.tensors.iter().enumerate() {
            let bytes = data(i)?;
            write_tensor_data(out, t, &bytes, align)?;
        }
        out.flush()
    }
}

/// Writes one tensor's bytes and the padding after it (default alignment),
/// checking the length.
pub fn write_tensor_padded(out: &mut dyn Write, t: &TensorSpec, bytes: &[u8]) -> io::Result<()> {
    write_tensor_data(out, t, bytes, DEFAULT_ALIGNMENT)
}

fn write_tensor_data(out: &mut dyn Write, t: &TensorSpec, bytes: &[u8], align: u64) -> io::Result<()> {
    if bytes.len() as u64 != t.size() {
        return Err(io::Error::other(format!(
            "{}: producer gave {} bytes, the tensor needs {}",
            t.name,
            bytes.len(),
            t.size()
        )));
    }
    out.write_all(bytes)?;
    let pad = t.size().next_multiple_of(align) - t.size();
    out.write_all(&vec![0u8; pad as usize])
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(u8::from(*x)),
        Value::String(s) => put_str(out, s),
        Value::Array(elem, items) => {
            out.extend_from_slice(&elem.tag().to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                put_value(out, item);
            }
        }
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
}
