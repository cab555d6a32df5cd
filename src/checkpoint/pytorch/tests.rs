//! Tests of the tensor views and conversions of torch storages.

use super::*;

fn view(offset: usize, shape: &[usize], stride: &[usize]) -> TensorView {
    TensorView {
        storage: 0,
        offset,
        shape: shape.to_vec(),
        stride: stride.to_vec(),
    }
}

#[test]
fn strided_views_visit_elements_in_row_major_order() {
    let mut budget = 1000;
    // x = arange(12).reshape(3, 4).t()[1:] : shape [3, 3], stride [1, 4], offset 1.
    let got = element_indices(&view(1, &[3, 3], &[1, 4]), 12, &mut budget).unwrap();
    assert_eq!(got, [1, 5, 9, 2, 6, 10, 3, 7, 11]);
    assert_eq!(budget, 991);
    let got = element_indices(&view(2, &[2, 1, 2], &[3, 0, 1]), 7, &mut budget).unwrap();
    assert_eq!(got, [2, 3, 5, 6]);
    assert_eq!(
        element_indices(&view(0, &[], &[]), 1, &mut budget).unwrap(),
        [0]
    );
    assert!(element_indices(&view(99, &[0, 5], &[5, 1]), 1, &mut budget)
        .unwrap()
        .is_empty());
}

#[test]
fn views_past_their_storage_or_over_budget_are_refused() {
    let mut budget = 1000;
    let e = element_indices(&view(1, &[3, 4], &[4, 1]), 12, &mut budget).unwrap_err();
    assert!(
        matches!(e, ViewError::PastStorage { offset: 1, .. }),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "size [3, 4], stride [4, 1] and offset 1 reach past its storage of 12 elements"
    );
    let e = element_indices(&view(0, &[usize::MAX, 2], &[1, 1]), 12, &mut budget).unwrap_err();
    assert_eq!(e, ViewError::SizeOverflows(vec![usize::MAX, 2]));
    let e = element_indices(&view(0, &[2, 2], &[usize::MAX, 1]), 12, &mut budget).unwrap_err();
    assert!(matches!(e, ViewError::PastStorage { .. }), "{e:?}");
    let e = element_indices(&view(0, &[2000], &[0]), 1, &mut budget).unwrap_err();
    assert_eq!(e, ViewError::OverBudget);
}

#[test]
fn materialized_types() {
    let storage = |dtype, numel| StorageRef {
        dtype,
        key: "0".into(),
        numel,
    };
    let mut budget = 100;
    let halves: Vec<u8> = [1.5f32, -2.0]
        .iter()
        .flat_map(|&v| f16::from_f32(v).to_le_bytes())
        .collect();
    let v = materialize(
        &view(0, &[2], &[1]),
        &storage(StorageDtype::F16, 2),
        &halves,
        &mut budget,
    )
    .unwrap();
    assert_eq!(v.to_f64(), [1.5, -2.0]);
    let v = materialize(
        &view(1, &[1], &[1]),
        &storage(StorageDtype::I8, 2),
        &[0, 0xff],
        &mut budget,
    )
    .unwrap();
    assert_eq!(v.dtype(), "int32");
    assert_eq!(v.to_f64(), [-1.0]);
}
