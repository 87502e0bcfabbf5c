//! How a durable task type's payload and output become JSON and back (feature `postgres`).
//!
//! A store sees payloads and outputs as `dyn Any`; a type registered on a durable pool carries
//! these four functions, made for its payload and output types when it is registered.

use std::any::Any;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::unwind;

/// The JSON side of one task type. Each call runs the type's serde impls, which are user
/// code: a panic in them comes back as an error (`its Serialize panicked: ...`), never
/// unwinds into the store.
#[derive(Clone, Copy)]
pub(crate) struct Codec {
    encode_payload: fn(&(dyn Any + Send)) -> Result<Value, String>,
    decode_payload: fn(Value) -> Result<Box<dyn Any + Send>, String>,
    encode_output: fn(&(dyn Any + Send + Sync)) -> Result<Value, String>,
    decode_output: fn(Value) -> Result<Box<dyn Any + Send + Sync>, String>,
}

impl Codec {
    /// The codec of payload type `P` and output type `O`.
    pub(crate) fn of<P, O>() -> Codec
    where
        P: Serialize + DeserializeOwned + Send + 'static,
        O: Serialize + DeserializeOwned + Send + Sync + 'static,
    {
        Codec {
            encode_payload: |payload| encode(payload.downcast_ref::<P>()),
            decode_payload: |value| {
                serde_json::from_value::<P>(value)
                    .map(|p| Box::new(p) as _)
                    .map_err(|e| e.to_string())
            },
            encode_output: |output| encode(output.downcast_ref::<O>()),
            decode_output: |value| {
                serde_json::from_value::<O>(value)
                    .map(|o| Box::new(o) as _)
                    .map_err(|e| e.to_string())
            },
        }
    }

    pub(crate) fn encode_payload(&self, payload: &(dyn Any + Send)) -> Result<Value, String> {
        serialize(|| (self.encode_payload)(payload))
    }

    pub(crate) fn decode_payload(&self, value: Value) -> Result<Box<dyn Any + Send>, String> {
        deserialize(|| (self.decode_payload)(value))
    }

    pub(crate) fn encode_output(&self, output: &(dyn Any + Send + Sync)) -> Result<Value, String> {
        serialize(|| (self.encode_output)(output))
    }

    pub(crate) fn decode_output(&self, value: Value) -> Result<Box<dyn Any + Send + Sync>, String> {
        deserialize(|| (self.decode_output)(value))
    }
}

fn encode<T: Serialize>(value: Option<&T>) -> Result<Value, String> {
    let value = value.ok_or_else(|| "a value of another type".to_owned())?;
    serde_json::to_value(value).map_err(|e| e.to_string())
}

fn serialize<T>(f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    unwind::catch(f).unwrap_or_else(|panic| Err(format!("its Serialize panicked: {panic}")))
}

fn deserialize<T>(f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    unwind::catch(f).unwrap_or_else(|panic| Err(format!("its Deserialize panicked: {panic}")))
}
