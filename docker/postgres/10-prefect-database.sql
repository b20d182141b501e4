-- PostgreSQL runs this once, when its data volume is new: MLflow's database is POSTGRES_DB (mlflow); Prefect
-- gets its own next to it, owned by the same role.
CREATE DATABASE prefect;
