//! GGUF files: a strict reader for untrusted files, split sets, and a
//! streaming writer used to make synthetic models.

mod check;
mod model;
mod read;
mod types;
mod value;
mod write;

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

pub use check::{MAX_EXPERTS, MAX_LAYERS, MIN_ALIGNMENT, RunShape, check_model, has_cpu_kernel, is_elementwise};
pub use model::{ModelFiles, TensorLocation};
pub use read::{DEFAULT_ALIGNMENT, GgufFile, TensorInfo, parse_split_path, split_path};
pub use types::GgmlType;
pub use value::{Value, ValueType};
pub use write::{GgufWriter, TensorSpec, write_tensor_padded};

/// The four bytes every GGUF file starts with.
pub const MAGIC: [u8; 4] = *b"GGUF";

/// Why a GGUF file or split set was refused.
#[derive(Debug)]
pub enum GgufError {
    /// The file could not be opened or read.
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        source: io::Error,
    },
    /// The bytes do not form a valid GGUF file (or split set).
    Invalid {
        /// The file, once known.
        path: Option<PathBuf>,
        /// Byte offset where the problem was found.
        offset: u64,
        /// The field or tensor being read.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
}

impl GgufError {
    fn invalid(offset: u64, field: &str, reason: impl Into<String>) -> GgufError {
        GgufError::Invalid { path: None, offset, field: field.to_string(), reason: reason.into() }
    }

    /// Attaches the file name to an error found while parsing its bytes.
    fn in_file(self, file: &Path) -> GgufError {
        match self {
            GgufError::Invalid { path: None, offset, field, reason } => {
                GgufError::Invalid { path: Some(file.to_path_buf()), offset, field, reason }
            }
            other => other,
        }
    }
}

impl fmt::Display for GgufError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GgufError::Io { path, source } => write!(f, "{}: {source}", path.display()),
            GgufError::Invalid { path, offset, field, reason } => {
                if let Some(p) = path {
                    write!(f, "{}: ", p.display())?;
                }
                write!(f, "not a valid GGUF file: {field} at byte {offset}: {reason}")
            }
        }
    }
}

/// The message already says what the I/O error was, so no source is
/// chained after it (a chain printer would repeat it).
impl std::error::Error for GgufError {}

#[cfg(test)]
mod tests;
