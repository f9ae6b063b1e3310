import json
import os

import pytest

from tfnmt.inference.decoding_threads import (SEARCH_FILE, decoding_threads, export_searches,
                                              gpu_present, write_search_settings)

NO_GPU = ("/nonexistent/nvidia[0-9]*",)


@pytest.mark.parametrize("searches, cores, expected", [
    (2, 2, (1, 2)),  # a core per search, each op on its search's core
    (2, 8, (4, 8)),
    (3, 8, (2, 8)),
    (4, 2, (1, 2)),  # more searches than cores: one thread per op still
    (1, 8, None),  # one search keeps TensorFlow's default: every core for each op
    (2, 1, None),
    (None, 2, None),  # an export that does not say
])
def test_the_cores_are_shared_out_among_the_searches(searches, cores, expected):
    assert decoding_threads(searches, cores, {}, NO_GPU) == expected


def test_threads_the_user_set_and_a_gpu_keep_the_default(tmp_path):
    for name in ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS"):
        assert decoding_threads(2, 2, {name: "2"}, NO_GPU) is None
    assert decoding_threads(2, 2, {"TF_NUM_INTRAOP_THREADS": ""}, NO_GPU) == (1, 2)
    # Set by tfnmt for a CPU limit (tfnmt/cpu_quota.py), they give way: the limit's 4 cores
    # are shared out.
    limited = {"TF_NUM_INTRAOP_THREADS": "4", "TF_NUM_INTEROP_THREADS": "4",
               "TFNMT_THREADS_SET": "1"}
    assert decoding_threads(2, 4, limited, NO_GPU) == (2, 4)
    (tmp_path / "nvidia0").touch()
    assert decoding_threads(2, 2, {}, (str(tmp_path / "nvidia[0-9]*"),)) is None
    # Any of the patterns: AMD's device file after NVIDIA's.
    amd = NO_GPU + (str(tmp_path / "kfd"),)
    assert not gpu_present(amd) and decoding_threads(2, 2, {}, amd) == (1, 2)
    (tmp_path / "kfd").touch()
    assert gpu_present(amd) and decoding_threads(2, 2, {}, amd) is None


def test_an_exports_searches_are_read_back_and_a_bad_record_reads_as_unknown(tmp_path):
    write_search_settings(str(tmp_path), 3)
    assert export_searches(str(tmp_path)) == 3
    path = tmp_path / SEARCH_FILE
    for text in ("", "{", json.dumps({"parallel_searches": 0}),
                 json.dumps({"parallel_searches": "2"}),
                 json.dumps({"parallel_searches": True}), json.dumps([2])):
        path.write_text(text)
        assert export_searches(str(tmp_path)) is None, text
    os.remove(path)
    assert export_searches(str(tmp_path)) is None
