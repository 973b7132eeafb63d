"""enginesim package."""
