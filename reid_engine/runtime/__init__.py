"""The run's runtime: the run plan (devices, precision, workers, compilation) and its rules, the CPU
budget, and compilation (policy, the guard that runs compiled steps, its cost record, the
compiled-module helpers). Decisions and mechanisms: the loop in ``engine`` calls them."""
