"""Work that touches the database and Redis for the monitoring app."""
