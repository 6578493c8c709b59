"""Selection programs for our kernel families, and transcriptions of SGLang's selection code."""
