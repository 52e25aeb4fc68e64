"""Pure domain logic shared by services and pipelines, no transport."""
