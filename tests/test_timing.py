"""The benchmark's clocks that the other tests do not reach through a bench run."""
import gc

from detent_rl.timing import GcPauses


def test_gc_pauses_time_every_pass_and_count_the_full_ones_while_open():
    """An online serve reads the collector's time around each step (`Bench._serve`): every pass is timed, only an
    oldest-generation pass counts as full, and nothing is counted once the watch is closed."""
    was = gc.isenabled()
    gc.disable()  # no automatic pass inside the test: only the explicit ones below
    try:
        with GcPauses() as watch:
            gc.collect(0)
            assert watch.full == 0 and watch.ms > 0  # a young pass: timed, not full
            young = watch.ms
            gc.collect()
            assert watch.full == 1 and watch.ms > young
        gc.collect()
        assert watch.full == 1 and watch._callback not in gc.callbacks  # closed: the pass after it is not seen
    finally:
        if was:
            gc.enable()
