"""Testbeds: model families the book's chapters run on (θ0, θt per task, a matrix rule, an evaluator)."""
