"""`Staging` carries named int64 and int32 arrays in one buffer and grows when a step needs it."""

import numpy as np
import torch

from runtime.worker.staging import Staging


def test_arrays_come_back_by_name_with_their_dtypes_and_values():
    staging = Staging(torch.device("cpu"), capacity=64)  # grows: these need 8*7 + 4*5 bytes
    a, b = np.arange(4, dtype=np.int64) - 2**40, np.array([7, -1, 3])
    c, d = np.array([1, 2, 3, 4], dtype=np.int32), np.array([-5])
    out = staging.upload(i64={"a": a, "b": b, "empty": np.zeros(0)}, i32={"c": c, "d": d})
    assert out["a"].dtype == torch.int64 and out["c"].dtype == torch.int32
    assert out["a"].tolist() == a.tolist() and out["b"].tolist() == [7, -1, 3]
    assert out["c"].tolist() == [1, 2, 3, 4] and out["d"].tolist() == [-5]
    assert out["empty"].numel() == 0 and staging.capacity >= 76
    again = staging.upload(i64={"a": np.array([9])}, i32={"c": np.array([8])})
    assert again["a"].tolist() == [9] and again["c"].tolist() == [8]
    assert out["a"].tolist() == a.tolist()  # an earlier step's tensors are not overwritten


def test_every_array_starts_16_byte_aligned_whatever_the_lengths_before_it():
    # Kernels are compiled per pointer alignment: a view whose alignment moved with the
    # batch's lengths would be compiled again mid-run.
    staging = Staging(torch.device("cpu"))
    for n in range(1, 9):
        out = staging.upload(i64={"a": np.arange(n), "b": np.arange(n + 1)},
                             i32={"c": np.arange(n), "d": np.arange(3), "e": np.arange(n + 2)})
        assert all(t.data_ptr() % 16 == 0 for t in out.values()), n
        assert out["b"].tolist() == list(range(n + 1)) and out["e"].tolist() == list(range(n + 2))
