//! `ClipTokenizer`: the Rust tokenizer on its own, for tests and benches (the loader tokenizes
//! in its own threads).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::tokenize::ClipTokenizer;

/// The Rust CLIP tokenizer on its own (tests and benches; the loader tokenizes in its threads).
#[pyclass(module = "shardstream._core", name = "ClipTokenizer")]
pub struct PyClipTokenizer {
    inner: ClipTokenizer,
}

#[pymethods]
impl PyClipTokenizer {
    /// `kind`: "bpe" (open_clip's merges file) or "json" (a Hugging Face tokenizer.json).
    #[new]
    fn new(kind: &str, path: &str, context_length: usize) -> PyResult<Self> {
        let inner = match kind {
            "bpe" => ClipTokenizer::from_bpe_file(path, context_length),
            "json" => ClipTokenizer::from_tokenizer_json(path, context_length),
            other => return Err(PyValueError::new_err(format!("tokenizer kind {other:?}"))),
        }
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(Self { inner })
    }

    #[getter]
    fn context_length(&self) -> usize {
        self.inner.context_length
    }

    /// The id rows are padded with: 0 for open_clip's BPE, a tokenizer.json's own pad id.
    #[getter]
    fn pad_id(&self) -> u32 {
        self.inner.pad
    }

    /// The cleaned text the tokenizer splits (for listing differences).
    #[staticmethod]
    fn clean(text: &str) -> String {
        crate::tokenize::clean(text)
    }

    /// Tokenizes `texts` into `len` int64 at `ptr` (`[len(texts), context_length]`), on this
    /// thread, without the GIL.
    fn tokenize_into(
        &self,
        py: Python<'_>,
        texts: Vec<String>,
        ptr: usize,
        len: usize,
    ) -> PyResult<()> {
        let ctx = self.inner.context_length;
        if ptr == 0 || len < texts.len() * ctx {
            return Err(PyValueError::new_err("token buffer too small"));
        }
        py.detach(|| {
            // SAFETY: the caller passes a live, writable int64 buffer of `len` elements.
            let out = unsafe { std::slice::from_raw_parts_mut(ptr as *mut i64, len) };
            for (row, text) in out.chunks_mut(ctx).zip(&texts) {
                self.inner.tokenize_into(text, row);
            }
        });
        Ok(())
    }
}
