"""tacc.testing.memscan.byte_values: the set of byte values, whatever the buffer."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from tacc.testing.memscan import byte_values


@given(st.binary(max_size=4096))
def test_byte_values_is_the_set_of_the_bytes(data: bytes) -> None:
    assert byte_values(data) == set(data)


def test_byte_values_of_a_numpy_view_and_a_slice() -> None:
    a = np.zeros(1 << 20, np.uint8)
    a[[5, 100, -1]] = [7, 255, 1]
    assert byte_values(a) == {0, 1, 7, 255}
    assert byte_values(a[:100]) == {0, 7}
