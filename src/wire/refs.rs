//! `session.output_refs` and `session.output_ref_read` params (llm-runner §9.13), decoded
//! strictly: a member neither op reads is refused by name, as every query's is.

use cortexkit_role_llm_runner::output_refs::{ListRequest, ReadRequest, MAX_READ_BYTES};
use serde_json::Value;

use super::{invalid_params, strict, Refusal};

/// `session.output_refs` params: `set_id` (a string), `after` (a string; null is absent).
pub fn decode_list(params: &Value) -> Result<ListRequest, Refusal> {
    strict(params, &["set_id", "after"])?;
    let set_id = string(params, "set_id")?.ok_or_else(|| invalid_params("set_id", "a set id is required"))?;
    let mut request = ListRequest::new(set_id);
    request.after = string(params, "after")?;
    Ok(request)
}

/// `session.output_ref_read` params: `ref_id`, and `offset` and `length` as unsigned integers
/// (`length` at most 131,072).
pub fn decode_read(params: &Value) -> Result<ReadRequest, Refusal> {
    strict(params, &["ref_id", "offset", "length"])?;
    let ref_id = string(params, "ref_id")?.ok_or_else(|| invalid_params("ref_id", "a record id is required"))?;
    let number = |field: &str| {
        params
            .get(field)
            .and_then(Value::as_u64)
            .ok_or_else(|| invalid_params(field, "an unsigned integer is required"))
    };
    let request = ReadRequest::new(ref_id, number("offset")?, number("length")?);
    if request.length > MAX_READ_BYTES {
        return Err(invalid_params("length", &format!("at most {MAX_READ_BYTES} bytes are read at once")));
    }
    Ok(request)
}

fn string(params: &Value, field: &str) -> Result<Option<String>, Refusal> {
    match params.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(invalid_params(field, "a string is required")),
    }
}
