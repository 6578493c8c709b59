"""SelIR: kernel selection written as small programs, solved for the fewest values to pin."""
from detent_rl.selir.errors import SelectionError, SelIRError
from detent_rl.selir.lang import (Fact, Request, Runtime, Unpinnable, assume, ceil, float32, knob, nearest_key,
                                  record, require)
from detent_rl.selir.parse import selection
from detent_rl.selir.program import Program

__all__ = ["Fact", "Request", "Runtime", "Unpinnable", "assume", "ceil", "float32", "knob", "nearest_key", "record",
           "require", "selection", "Program", "SelectionError", "SelIRError"]
