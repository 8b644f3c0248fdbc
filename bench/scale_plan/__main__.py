from bench.scale_plan.report import main

main()
