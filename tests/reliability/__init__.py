"""Reliability and security suite: diag never harms the job, never loses data, lets no one in."""
