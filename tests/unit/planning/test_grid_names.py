"""sweep --grid takes the names users know: Triton's config.pbtxt fields as written."""

from schedsim.planning.grid import parse_grid


def test_triton_field_names_are_the_policy_parameters():
    grid = parse_grid(["max_queue_delay_microseconds=0,500", "default-timeout-microseconds=1000",
                       "preferred_batch_size=8/16"])
    assert grid == {"max_queue_delay_us": [0, 500], "default_timeout_us": [1000], "preferred_batch_sizes": [(8, 16)]}
