//! Values between Python and CBOR: `None`, `bool`, `int`, `float`, `str`,
//! `bytes`, lists (and tuples) and dicts, nested at most [`MAX_DEPTH`]
//! deep. Models and dataclasses are dumped to these by the Python layer
//! first.

use capwire::envelope::RawValue;
use ciborium::Value;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

use crate::errors::Fail;
use pyo3::types::{
    PyBool, PyByteArray, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple,
};

/// How deep a value may nest, either way.
pub(crate) const MAX_DEPTH: usize = 128;

fn too_deep() -> PyErr {
    PyValueError::new_err(format!("the value nests deeper than {MAX_DEPTH} levels"))
}

/// A CBOR value as a Python object.
pub(crate) fn to_py<'py>(
    py: Python<'py>,
    value: &Value,
    depth: usize,
) -> PyResult<Bound<'py, PyAny>> {
    if depth > MAX_DEPTH {
        return Err(too_deep());
    }
    Ok(match value {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        Value::Integer(i) => i128::from(*i).into_pyobject(py)?.into_any(),
        Value::Float(f) => PyFloat::new(py, *f).into_any(),
        Value::Text(s) => PyString::new(py, s).into_any(),
        Value::Bytes(b) => PyBytes::new(py, b).into_any(),
        Value::Array(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(to_py(py, item, depth + 1)?)?;
            }
            list.into_any()
        }
        Value::Map(entries) => {
            let dict = PyDict::new(py);
            for (k, v) in entries {
                dict.set_item(to_py(py, k, depth + 1)?, to_py(py, v, depth + 1)?)?;
            }
            dict.into_any()
        }
        // A tag says how to read its value; Python gets the value.
        Value::Tag(_, inner) => to_py(py, inner, depth + 1)?,
        other => {
            return Err(PyValueError::new_err(format!(
                "a CBOR value with no Python form: {other:?}"
            )));
        }
    })
}

/// A Python object as a CBOR value.
pub(crate) fn from_py(obj: &Bound<'_, PyAny>, depth: usize) -> PyResult<Value> {
    if depth > MAX_DEPTH {
        return Err(too_deep());
    }
    if obj.is_none() {
        return Ok(Value::Null);
    }
    if let Ok(b) = obj.cast::<PyBool>() {
        return Ok(Value::Bool(b.is_true()));
    }
    if let Ok(i) = obj.cast::<PyInt>() {
        let n: i128 = i
            .extract()
            .map_err(|_| PyValueError::new_err("the integer is out of CBOR's range"))?;
        let n = ciborium::value::Integer::try_from(n)
            .map_err(|_| PyValueError::new_err("the integer is out of CBOR's range"))?;
        return Ok(Value::Integer(n));
    }
    if let Ok(f) = obj.cast::<PyFloat>() {
        return Ok(Value::Float(f.value()));
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(Value::Text(s.to_str()?.to_owned()));
    }
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(Value::Bytes(b.as_bytes().to_vec()));
    }
    if let Ok(b) = obj.cast::<PyByteArray>() {
        return Ok(Value::Bytes(b.to_vec()));
    }
    if let Ok(list) = obj.cast::<PyList>() {
        return list
            .iter()
            .map(|x| from_py(&x, depth + 1))
            .collect::<PyResult<_>>()
            .map(Value::Array);
    }
    if let Ok(tuple) = obj.cast::<PyTuple>() {
        return tuple
            .iter()
            .map(|x| from_py(&x, depth + 1))
            .collect::<PyResult<_>>()
            .map(Value::Array);
    }
    if let Ok(dict) = obj.cast::<PyDict>() {
        let mut entries = Vec::with_capacity(dict.len());
        for (k, v) in dict.iter() {
            entries.push((from_py(&k, depth + 1)?, from_py(&v, depth + 1)?));
        }
        return Ok(Value::Map(entries));
    }
    Err(PyTypeError::new_err(format!(
        "a {} cannot be sent: send None, bool, int, float, str, bytes, lists and dicts of them, \
         or a pydantic model or dataclass",
        obj.get_type().name()?
    )))
}

/// A Python object as raw CBOR.
pub(crate) fn encode(obj: &Bound<'_, PyAny>) -> PyResult<RawValue> {
    let value = from_py(obj, 0)?;
    RawValue::encode(&value)
        .map_err(|e| PyValueError::new_err(format!("the value does not encode: {e}")))
}

/// Raw CBOR as a CBOR value (no Python needed: decoded off the loop).
pub(crate) fn decode(raw: &RawValue) -> Result<Value, String> {
    raw.decode::<Value>().map_err(|e| e.to_string())
}

/// A decoded value that becomes a Python object when handed to Python.
pub(crate) struct Cbor(pub(crate) Value);

impl<'py> IntoPyObject<'py> for Cbor {
    type Target = PyAny;
    type Output = Bound<'py, PyAny>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> Result<Self::Output, Self::Error> {
        to_py(py, &self.0, 0)
    }
}

/// Raw CBOR decoded for Python, or the error it is.
pub(crate) fn cbor(raw: &RawValue) -> Result<Cbor, Fail> {
    decode(raw).map(Cbor).map_err(|e| {
        Fail::Py(PyValueError::new_err(format!(
            "the value does not decode: {e}"
        )))
    })
}

/// A value that serializes (a manifest, a task's info) as a Python object,
/// through its CBOR form.
pub(crate) fn serialized<T: serde::Serialize>(value: &T) -> Result<Cbor, Fail> {
    let raw =
        RawValue::encode(value).map_err(|e| Fail::Py(PyValueError::new_err(e.to_string())))?;
    cbor(&raw)
}
