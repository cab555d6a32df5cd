//! The one edit of a decoded model left: pointing its external data at a copied data file.
//! Graphs are never edited after they are emitted; a file this tool wrote is emitted again
//! with another interface instead (src/rebuild.rs). This stays because it applies to any
//! ONNX file, this tool's or not: serving a file whose data is copied under another name
//! (Triton's repository of a stateless file from elsewhere, a genai folder).

use crate::onnx::proto as onnx;

/// Points every initializer of `model`'s graph with external data at the file `location`
/// beside the model (a data file copied under another name: any ONNX file's, this tool's
/// or not).
pub fn relocate_external_data(model: &mut onnx::ModelProto, location: &str) {
    let Some(graph) = model.graph.as_mut() else {
        return;
    };
    for t in &mut graph.initializer {
        for entry in &mut t.external_data {
            if entry.key() == "location" {
                entry.value = Some(location.to_string());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn external_data_is_relocated_and_the_offsets_are_kept() {
        let entry = |k: &str, v: &str| onnx::StringStringEntryProto {
            key: Some(k.into()),
            value: Some(v.into()),
        };
        let mut m = onnx::ModelProto {
            graph: Some(onnx::GraphProto {
                initializer: vec![onnx::TensorProto {
                    external_data: vec![entry("location", "a.data"), entry("offset", "0")],
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        relocate_external_data(&mut m, "b.data");
        let t = &m.graph.as_ref().unwrap().initializer[0];
        assert_eq!(t.external_data[0].value(), "b.data");
        assert_eq!(t.external_data[1].value(), "0");
        // A model without a graph is left as it is.
        relocate_external_data(&mut onnx::ModelProto::default(), "b.data");
    }
}
