//! Builds a tiny ONNX sequence-classification model by hand (protobuf written field by field), so the
//! ONNX NLI path can be tested without an NLI model, none being obtainable offline. Its three logits
//! depend on the pair's token count n: [n - pivot, pivot - n, 0]. Long pairs favour label 0, short
//! pairs label 1. It takes input_ids and attention_mask but no token_type_ids, like RoBERTa exports.

fn varint(mut value: u64, out: &mut Vec<u8>) {
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

fn int_field(field: u64, value: i64, out: &mut Vec<u8>) {
    varint(field << 3, out);
    varint(value as u64, out);
}

fn bytes_field(field: u64, bytes: &[u8], out: &mut Vec<u8>) {
    varint((field << 3) | 2, out);
    varint(bytes.len() as u64, out);
    out.extend_from_slice(bytes);
}

fn message(build: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut out = Vec::new();
    build(&mut out);
    out
}

const FLOAT: i64 = 1;
const INT64: i64 = 7;

/// ValueInfoProto for a tensor whose dims are symbolic (`Some(name)`) or fixed.
fn value_info(name: &str, elem_type: i64, dims: &[Result<&str, i64>]) -> Vec<u8> {
    let shape = message(|s| {
        for dim in dims {
            let d = message(|d| match dim {
                Ok(param) => bytes_field(2, param.as_bytes(), d),
                Err(value) => int_field(1, *value, d),
            });
            bytes_field(1, &d, s);
        }
    });
    let tensor_type = message(|t| {
        int_field(1, elem_type, t);
        bytes_field(2, &shape, t);
    });
    let type_proto = message(|t| bytes_field(1, &tensor_type, t));
    message(|v| {
        bytes_field(1, name.as_bytes(), v);
        bytes_field(2, &type_proto, v);
    })
}

fn float_tensor(name: &str, dims: &[i64], values: &[f32]) -> Vec<u8> {
    message(|t| {
        for d in dims {
            int_field(1, *d, t);
        }
        int_field(2, FLOAT, t);
        bytes_field(8, name.as_bytes(), t);
        let raw: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        bytes_field(9, &raw, t);
    })
}

/// NodeProto; `attributes` are (name, type, encoded value field) already written.
fn node(op: &str, inputs: &[&str], output: &str, attributes: Vec<Vec<u8>>) -> Vec<u8> {
    message(|n| {
        for input in inputs {
            bytes_field(1, input.as_bytes(), n);
        }
        bytes_field(2, output.as_bytes(), n);
        bytes_field(3, format!("{op}_{output}").as_bytes(), n);
        bytes_field(4, op.as_bytes(), n);
        for attribute in attributes {
            bytes_field(5, &attribute, n);
        }
    })
}

fn int_attribute(name: &str, value: i64) -> Vec<u8> {
    message(|a| {
        bytes_field(1, name.as_bytes(), a);
        int_field(3, value, a);
        int_field(20, 2, a); // AttributeType INT
    })
}

fn ints_attribute(name: &str, values: &[i64]) -> Vec<u8> {
    message(|a| {
        bytes_field(1, name.as_bytes(), a);
        for v in values {
            int_field(8, *v, a);
        }
        int_field(20, 7, a); // AttributeType INTS
    })
}

/// The serialized model (ONNX IR 7, opset 11).
pub fn length_classifier(pivot: f32) -> Vec<u8> {
    let graph = message(|g| {
        bytes_field(1, &node("Cast", &["attention_mask"], "mask_f", vec![int_attribute("to", FLOAT)]), g);
        let reduce = vec![ints_attribute("axes", &[1]), int_attribute("keepdims", 1)];
        bytes_field(1, &node("ReduceSum", &["mask_f"], "n", reduce), g);
        bytes_field(1, &node("MatMul", &["n", "w"], "scaled", vec![]), g);
        bytes_field(1, &node("Add", &["scaled", "b"], "logits", vec![]), g);
        bytes_field(2, b"length_classifier", g);
        bytes_field(5, &float_tensor("w", &[1, 3], &[1.0, -1.0, 0.0]), g);
        bytes_field(5, &float_tensor("b", &[3], &[-pivot, pivot, 0.0]), g);
        bytes_field(11, &value_info("input_ids", INT64, &[Ok("batch"), Ok("seq")]), g);
        bytes_field(11, &value_info("attention_mask", INT64, &[Ok("batch"), Ok("seq")]), g);
        bytes_field(12, &value_info("logits", FLOAT, &[Ok("batch"), Err(3)]), g);
    });
    message(|m| {
        int_field(1, 7, m);
        bytes_field(2, b"lacuna-tests", m);
        bytes_field(7, &graph, m);
        let opset = message(|o| {
            bytes_field(1, b"", o);
            int_field(2, 11, o);
        });
        bytes_field(8, &opset, m);
    })
}
