"""Views: derived values, findings and N/A reasons (one place for words)."""
