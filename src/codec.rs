//! How a durable task type's payload and output become JSON and back (feature `postgres`).
//!
//! A store sees payloads and outputs as `dyn Any`; a type registered on a durable pool carries
//! these four functions, made for its payload and output types when it is registered.

use std::any::Any;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// The JSON side of one task type.
#[derive(Clone, Copy)]
pub(crate) struct Codec {
    pub(crate) encode_payload: fn(&(dyn Any + Send)) -> Result<Value, String>,
    pub(crate) decode_payload: fn(Value) -> Result<Box<dyn Any + Send>, String>,
    pub(crate) encode_output: fn(&(dyn Any + Send + Sync)) -> Result<Value, String>,
    pub(crate) decode_output: fn(Value) -> Result<Box<dyn Any + Send + Sync>, String>,
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
}

fn encode<T: Serialize>(value: Option<&T>) -> Result<Value, String> {
    let value = value.ok_or_else(|| "a value of another type".to_owned())?;
    serde_json::to_value(value).map_err(|e| e.to_string())
}
