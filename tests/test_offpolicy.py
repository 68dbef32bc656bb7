"""The old-weight mask (rollout/offpolicy.py): every request whose weight version is not the episode's last is out
of the loss; an episode whose versions the server did not report is left as it is."""

import pytest

from tau2_rl_pipeline.rollout.offpolicy import mask_older_turns, versions_of


def test_turns_of_older_weights_are_masked_and_observations_stay_masked():
    mask = [1, 1, 0, 0, 1, 1, 1, 0, 1]  # turn 1 (2 ids), observation, turn 2 cut (1 id) + continued (2), obs, turn 3
    spans = [(0, 2), (4, 5), (5, 7), (8, 9)]
    assert mask_older_turns(mask, spans, ["3", "3", "4", "4"]) == [0, 0, 0, 0, 0, 1, 1, 0, 1]
    assert mask_older_turns(mask, spans, ["4", "4", "4", "4"]) == mask  # one weight version: nothing to mask
    assert mask_older_turns(mask, spans, ["3", "3", "4", None]) == mask  # unknown: nothing can be told
    assert mask_older_turns([], [], []) == []


def test_spans_and_versions_must_pair_up():
    with pytest.raises(ValueError, match="2 request spans but 1 weight versions"):
        mask_older_turns([1, 1], [(0, 1), (1, 2)], ["1"])


def test_versions_as_sglang_reports_them():
    assert versions_of([{"weight_version": 3}, {"prompt_tokens": 4}, {"weight_version": "default"}]) == [
        "3", None, "default"]
