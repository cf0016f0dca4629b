"""The Newton–Schulz op: its arguments, coefficients, how an evaluation is computed in plain torch,
what each algorithm costs and the matmul rates the cost model reads."""
