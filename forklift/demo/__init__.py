"""`forklift demo`: a Mandelbrot image rendered as one batch of jobs by the real supervisor,
a worker SIGKILLed midway, the image assembled by the batch's callback, and a check that
every effect committed exactly once."""
