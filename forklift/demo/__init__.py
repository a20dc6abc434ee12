"""`forklift demo`: a Mandelbrot image rendered as jobs by the real supervisor, a worker
SIGKILLed midway, and a check that every tile's effect committed exactly once."""
