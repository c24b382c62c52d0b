"""A pytest plugin for ``measure.sh kernels`` (issue 68 item 3 (c)): the kernels' compiled
correctness cases first, ordered by risk, so that a run cut by its timeout has tested
what matters most (``pytest -v``: the names that passed are in the log).

  PYTHONPATH=tools/gpu:$PYTHONPATH python -m pytest -p kernel_order -v tests/...

Order: one telling case of each family (the swap-AB forward's 32- and 64-byte swizzles at
batch tiles 16 and 32, the RHN micro-layer kernels over two CTAs and as a layer scan, the
gated backward at N = 128, the reset-after GRU, SC-LSTM, the chained kernels), then the
rest of each family's reference checks in the same order, then the task-level runs
(stacked seeds, the LM and classifier tasks), then every other collected test in file
order. A pattern matches a test whose node id contains it; one that matches nothing
(a case renamed) is ignored.
"""

RISK = [
    # one case of each family
    "test_swap_ab.py::test_outputs_match_the_reference[n100_bt16_pmnist_like_lengths]",
    "test_swap_ab.py::test_outputs_match_the_reference[n128_bt32_two_ctas_lengths_masked]",
    "test_swap_ab.py::test_lstm_unroll_with_a_batch_tile_matches_the_reference[n100_bt32",
    "test_rhn_pallas.py::test_values_and_gradients_match_the_reference[hsg_two_by_two_ctas",
    "test_rhn_pallas.py::test_values_and_gradients_match_the_reference[rhn_depth12_masked]",
    "test_gated_pallas.py::test_values_and_gradients_match_the_reference[lstm_pmnist_like]",
    "test_gated_pallas.py::test_values_and_gradients_match_the_reference[lstm_exact_n128",
    "test_gated_pallas.py::test_values_and_gradients_match_the_reference[gru_pmnist_like]",
    "test_gated_pallas.py::test_values_and_gradients_match_the_reference[sc_lstm_p_two_warp",
    "test_chained_pallas.py::test_values_and_gradients_match_the_reference[pmnist_like]",
    # the rest of each family's reference checks
    "test_swap_ab.py::test_outputs_match_the_reference",
    "test_swap_ab.py::test_lstm_unroll_with_a_batch_tile_matches_the_reference",
    "test_rhn_pallas.py::test_values_and_gradients_match_the_reference",
    "test_rhn_pallas.py::test_backward_kernels_are_the_default",
    "test_gated_pallas.py::test_values_and_gradients_match_the_reference[lstm",
    "test_gated_pallas.py::test_values_and_gradients_match_the_reference[gru",
    "test_gated_pallas.py::test_values_and_gradients_match_the_reference[sc_lstm",
    "test_chained_pallas.py::test_values_and_gradients_match_the_reference",
    # task-level runs
    "test_swap_ab.py::test_stacked_seeds",
    "test_rhn_pallas.py::test_the_lm_task",
    "test_gated_pallas.py::test_the_classifier_task",
    "test_gated_pallas.py::test_outputs_false",
    "test_chained_pallas.py::test_outputs_false",
    "test_gated_pallas.py::test_the_lm_task",
    "test_rhn_pallas.py::test_stacked_seeds",
    "test_gated_pallas.py::test_stacked_seeds",
    "test_chained_pallas.py::test_stacked_seeds",
    "test_chained_pallas.py::test_parallel_cells",
]


def rank(nodeid: str) -> int:
    """The index of the first pattern of :data:`RISK` in ``nodeid``; after them all if
    none."""
    return next((i for i, p in enumerate(RISK) if p in nodeid), len(RISK))


def pytest_collection_modifyitems(session, config, items):
    items[:] = sorted(items, key=lambda item: rank(item.nodeid))  # stable: file order
